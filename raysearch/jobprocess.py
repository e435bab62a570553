"""A process of the driver's own for one job of a search's end, started while the trials run,
handed one pickled job on standard input, answering once on standard output (the driver's
threads share one interpreter lock). It ends after its answer or when its input closes, and
ignores Ctrl-C (the driver ends it).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["JobProcess", "serve_one_job"]

_logger = logging.getLogger("raysearch")

#: Seconds :meth:`JobProcess.close` waits for the process to end before killing it.
CLOSE_WAIT_S = 5.0


class JobProcess:
    """The process that runs ``python -m module``, or the script ``module`` names (importing
    nothing of raysearch); nothing runs until :meth:`start` or :meth:`submit`.
    """

    def __init__(self, module: str | Path) -> None:
        self.module = str(module)
        self._command = ["-m", self.module] if isinstance(module, str) else [self.module]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def started(self) -> bool:
        """Whether the process was started and not closed yet."""
        return self._process is not None

    def start(self) -> None:
        """Start the process (once): it imports what its job needs, then waits for it."""
        if self._process is not None:
            return
        env = dict(os.environ)
        # The raysearch this driver runs, whatever put it on the driver's path.
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, *self._command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def submit(self, job: Mapping[str, Any]) -> None:
        """Hand the process its one job; it starts on it at once (started here if it was not)."""
        self.start()
        assert self._process is not None and self._process.stdin is not None
        try:
            pickle.dump(dict(job), self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._process.stdin.close()
        except OSError as exc:  # it ended already: answer() says so
            _logger.debug("%s took no job: %s", self.module, exc)

    def answer(self) -> dict[str, Any]:
        """Wait for the answer and end the process: ``{"answer": ...}`` or ``{"error": "..."}``."""
        assert self._process is not None and self._process.stdout is not None
        try:
            answer = pickle.load(self._process.stdout)
        except (EOFError, pickle.UnpicklingError, OSError) as exc:
            answer = {"error": f"the process ended without an answer ({exc!r})"}
        finally:
            self.close()
        return answer

    def close(self) -> None:
        """End the process (idle, or still working) and wait for it."""
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            process.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve_one_job(prepare: Callable[[], Callable[..., Any]]) -> None:
    """The process's side: ``prepare()`` returns the function, then one job is answered."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    run = prepare()
    try:
        job = pickle.load(sys.stdin.buffer)
    except EOFError:  # closed without a job: nothing to do
        return
    try:
        answer: dict[str, Any] = {"answer": run(**job)}
    except Exception as exc:  # noqa: BLE001 - said by the driver, which decides what follows
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()
    except OSError:  # the driver closed the pipe (it ended, or gave up): no one to answer,
        os._exit(0)  # and nothing to flush at the interpreter's exit into a closed pipe
