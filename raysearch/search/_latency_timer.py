"""Latency timed again after the last trial (:mod:`raysearch.search._retime`) in a process of
its own, started while the trials run, so that the plots drawn meanwhile hold no Python lock a
timing ``session.run`` would wait for (:class:`raysearch.jobprocess.JobProcess`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from raysearch.jobprocess import JobProcess, serve_one_job

__all__ = ["LatencyTimer"]

_logger = logging.getLogger("raysearch.search")


class LatencyTimer(JobProcess):
    """The timing process of one search (:meth:`submit`: ``time_rounds``'s arguments)."""

    def __init__(self) -> None:
        super().__init__(__name__)

    def result(self) -> dict[str, dict[str, list[float]]] | None:
        """The rounds of the job submitted; None (and a warning) when it could not time them."""
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
