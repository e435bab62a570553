"""Latency timed again after the last trial in a process of its own on the driver, so that the
search writes its plots meanwhile (:mod:`raysearch.search._retime`).

Not a thread: one timing ``session.run`` would wait for Python's lock while another draws
the plots, which would count in the figure. The process is started while the trials run,
handed one pickled job (:attr:`RetimePlan.job <raysearch.search._retime.RetimePlan.job>`)
and answers with the rounds, or the error ONNX Runtime raised; it ends after its answer or
as soon as its standard input closes.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LatencyTimer"]

_logger = logging.getLogger("raysearch.search")

#: Seconds :meth:`LatencyTimer.close` waits for the process to end before killing it.
_CLOSE_WAIT_S = 5.0


class LatencyTimer:
    """The timing process of one search; nothing runs until :meth:`start` or :meth:`submit`."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (once): it imports what timing needs, then waits for a job."""
        if self._process is not None:
            return
        env = dict(os.environ)
        # The raysearch this driver runs, whatever put it on the driver's path.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def submit(self, job: Mapping[str, Any]) -> None:
        """Hand the process its one job (:func:`~raysearch.search._retime.time_rounds`'s
        arguments); it starts timing at once."""
        self.start()
        assert self._process is not None and self._process.stdin is not None
        try:
            pickle.dump(dict(job), self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._process.stdin.close()
        except OSError as exc:  # it ended already: result() says so
            _logger.debug("the latency timer took no job: %s", exc)

    def result(self) -> dict[str, dict[str, list[float]]] | None:
        """The rounds of the job submitted; None (and a warning) when it could not time a
        model or ended without an answer: the trials' figures stay."""
        assert self._process is not None and self._process.stdout is not None
        try:
            answer = pickle.load(self._process.stdout)
        except (EOFError, pickle.UnpicklingError, OSError) as exc:
            answer = {"error": f"the timing process ended without an answer ({exc!r})"}
        finally:
            self.close()
        if "error" in answer:
            _logger.warning("latency could not be timed again alone: %s", answer["error"])
            return None
        return answer["rounds"]

    def close(self) -> None:
        """End the process (idle, or still timing) and wait for it."""
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            process.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _serve() -> None:
    """The process: import, wait for one job on standard input, answer on standard output
    (anything else written there goes to standard error instead)."""
    import signal

    # Ctrl-C reaches the terminal's whole process group: the driver ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # Imported before the job comes: what timing runs (ONNX Runtime among them).
    import raysearch.evaluate  # noqa: F401
    import raysearch.providers  # noqa: F401
    from raysearch.search._retime import time_rounds

    try:
        job = pickle.load(sys.stdin.buffer)
    except EOFError:  # closed without a job: nothing to time
        return
    try:
        answer: dict[str, Any] = {"rounds": time_rounds(**job)}
    except Exception as exc:  # noqa: BLE001 - said by the driver, which keeps the trials' figures
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
    answers.flush()


if __name__ == "__main__":
    _serve()
