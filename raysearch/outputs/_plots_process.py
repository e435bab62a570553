"""``plots/`` drawn in a process of its own while the driver writes the other outputs.

matplotlib holds the interpreter's lock while it draws, so a thread of the driver would draw
the plots after the report, not beside it; a process draws them on another core. The process
(:mod:`raysearch.outputs._plot_render`, run as a script: it imports matplotlib, not the
``raysearch`` package) is started while the trials run, draws one small figure of each kind
then, and is handed :func:`~raysearch.outputs._plots.plot_job`'s specs after the last trial;
it answers with the PNGs, which the driver writes into ``plots/``. Where it fails (or ends
without an answer), the driver draws the plots itself: no output is lost to it.

Only a process that ends with its search uses one (the ``raysearch`` command): a program that
runs several searches keeps matplotlib imported and warm in its own process from the first
search on, where a plot process would import it again for each.

Example:
    >>> plots = PlotProcess()
    >>> plots.start()                                # while the trials run # doctest: +SKIP
    >>> plots.draw(plot_job(rows, config, None, summary))  # after the last # doctest: +SKIP
    >>> plots.wait(out)                              # once the rest is written # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysearch.jobprocess import JobProcess
from raysearch.outputs import _plot_render

__all__ = ["PlotProcess"]

_logger = logging.getLogger("raysearch.outputs")


class PlotProcess(JobProcess):
    """The plot process of one search; nothing runs until :meth:`start` or :meth:`draw`."""

    def __init__(self) -> None:
        super().__init__(Path(_plot_render.__file__))
        self._specs: dict[str, Any] | None = None

    def draw(self, specs: Mapping[str, Mapping[str, Any]]) -> None:
        """Hand the process :func:`~raysearch.outputs._plots.plot_job`'s specs; it draws at
        once."""
        self._specs = dict(specs)
        self.submit({"specs": self._specs})

    def wait(self, out: Path) -> None:
        """Write ``plots/`` into ``out`` once the process answers with the PNGs; where it
        failed, or ended without an answer, draw them here, with a warning. A plot that fails
        here too is logged, never raised."""
        from raysearch.outputs._plots import write_pngs

        if self._specs is None:
            return
        specs, self._specs = self._specs, None
        answer = self.answer()
        try:
            if "error" not in answer:
                write_pngs(out, answer["answer"])
                return
            _logger.warning(
                "the plot process failed (%s): plots/ drawn by the driver", answer["error"]
            )
            write_pngs(out, _plot_render.render(specs))
        except Exception:
            _logger.exception("writing plots/ failed")
