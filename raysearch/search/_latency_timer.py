"""Latency timed again after the last trial in a process of its own on the driver, so that the
search writes its plots meanwhile (:mod:`raysearch.search._retime`).

A thread of the driver would not do: a thread timing ``session.run`` waits for Python's lock
after each run while another thread draws the plots (up to the interpreter's switch interval,
5 ms, or a whole C call of matplotlib's), which would count in the figure. The process is
started while the trials run (its imports, about a second of one CPU, then it waits on its
standard input), is handed one job (:attr:`RetimePlan.job
<raysearch.search._retime.RetimePlan.job>`, pickled) and answers with the rounds
(:func:`~raysearch.search._retime.time_rounds`), or with the error ONNX Runtime raised. It
ends after its answer, or as soon as its standard input closes: :meth:`LatencyTimer.close`,
or the driver's end however it comes (:class:`raysearch.jobprocess.JobProcess`).

Example:
    >>> timer = LatencyTimer()
    >>> timer.start()                       # while the trials run      # doctest: +SKIP
    >>> timer.submit(plan.job)              # after the last one        # doctest: +SKIP
    >>> rounds = timer.result()             # after writing the plots   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from raysearch.jobprocess import JobProcess, serve_one_job

__all__ = ["LatencyTimer"]

_logger = logging.getLogger("raysearch.search")


class LatencyTimer(JobProcess):
    """The timing process of one search; nothing runs until :meth:`start` or :meth:`submit`
    (:meth:`submit`: :func:`~raysearch.search._retime.time_rounds`'s arguments)."""

    def __init__(self) -> None:
        super().__init__(__name__)

    def result(self) -> dict[str, dict[str, list[float]]] | None:
        """The rounds of the job submitted; None (and a warning) when it could not time a
        model or ended without an answer: the trials' figures stay."""
        answer = self.answer()
        if "error" in answer:
            _logger.warning("latency could not be timed again alone: %s", answer["error"])
            return None
        return answer["answer"]


def _prepare() -> Callable[..., Any]:
    """Imported before the job comes: what timing runs (ONNX Runtime among them)."""
    import raysearch.evaluate  # noqa: F401
    import raysearch.providers  # noqa: F401
    from raysearch.search._retime import time_rounds

    return time_rounds


if __name__ == "__main__":
    serve_one_job(_prepare)
