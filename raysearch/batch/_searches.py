"""The model searches of a batch as child processes: at most so many at once, each stopped
after its time limit, and a model whose folder a search of an earlier (killed) batch still
holds started once that search ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from raysearch.batch._progress import BatchProgress

__all__ = ["BatchSearches", "LOCAL_RAY_LOST_S", "local_ray_env", "say"]

_logger = logging.getLogger("raysearch.batch._batch")


class BatchSearches:
    """The model searches of a batch as processes: at most ``at_once`` running, each stopped
    after its time limit in ``timeouts`` (seconds by model name); a failed one's last error
    line goes to ``errors``; ``env``: their environment (None: this process's)."""

    def __init__(
        self,
        out: Path,
        at_once: int,
        timeouts: dict[str, float | None],
        errors: dict[str, str],
        progress: TextIO | None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.out = out
        self.env = env
        self.at_once = at_once
        self.timeouts = timeouts
        self.errors = errors
        self.progress = progress
        self.running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
        #: Models whose folder a leftover search held, since when.
        self.held_since: dict[str, float] = {}
        #: Each search's start and end (seconds since the epoch) as this batch saw them.
        self.spans: dict[str, tuple[float, float]] = {}
        #: The progress line over the models (made when :meth:`run` starts).
        self.meter: BatchProgress | None = None

    def run(
        self,
        queue: list[tuple[str, list[str]]],
        *,
        models: Sequence[str] = (),
        kept: Mapping[str, bool] | None = None,
        fresh: Iterable[str] = (),
    ) -> None:
        """Run the searches of ``queue`` (model name, ``raysearch`` arguments). The progress
        line counts every one of ``models``: those in ``errors`` as failed, those ``kept``
        from an earlier run as they ended; ``fresh`` models start over."""
        waiting = list(queue)
        kept = dict(kept or {})
        names = list(models) or [name for name, _ in queue]
        searched = [name for name, _ in queue] + list(kept)
        self.meter = BatchProgress(self.out, names, self.progress, searched=searched, fresh=fresh)
        done: list[str] = [name for name, ok in kept.items() if ok]

        def failed() -> list[str]:
            return [n for n in names if n in self.errors or kept.get(n) is False]

        while waiting or self.running:
            self._start_waiting(waiting)
            for name, (proc, log, started) in list(self.running.items()):
                code = proc.poll()
                limit = self.timeouts.get(name)
                if code is None and limit and time.monotonic() - started > limit:
                    _stop(proc)
                    self._ended(name)
                    self.errors[name] = (
                        f"timed out after {limit:g} s (model_timeout_s); the next run resumes it"
                    )
                    self._say(f"{name}: {self.errors[name]}")
                elif code is not None:
                    self._ended(name)
                    if code != 0:
                        self.errors[name] = f"exit status {code}: {_tail(log)}"
                    else:
                        done.append(name)
                    self._say(f"{name}: {'done' if code == 0 else self.errors[name]}")
            self.meter.update(self.running, done, failed(), len(waiting))
            time.sleep(0.2)
        self.meter.close(done, failed())

    def _say(self, text: str) -> None:
        """An event of a model (started, ended) on a line of its own, beside the progress."""
        if self.meter is not None:
            self.meter.say(text)
        else:
            say(self.progress, text)

    def _start_waiting(self, waiting: list[tuple[str, list[str]]]) -> None:
        """Start waiting searches while slots are free. A model whose folder a search left by
        a killed batch still holds starts once that search ends; waited for longer than
        :data:`_HELD_WAIT_S`, it is recorded as failed."""
        from raysearch.search.runner import search_running_in

        for name, cmd in list(waiting):
            if len(self.running) >= self.at_once:
                return
            if search_running_in(self.out / name):
                if name not in self.held_since:
                    self.held_since[name] = time.monotonic()
                    self._say(f"{name}: waiting for the search still running there")
                if time.monotonic() - self.held_since[name] > _HELD_WAIT_S:
                    waiting.remove((name, cmd))
                    self.errors[name] = (
                        f"its folder stayed in use by another search for {_HELD_WAIT_S:g} s; "
                        "the next run resumes it"
                    )
                    self._say(f"{name}: {self.errors[name]}")
                continue
            waiting.remove((name, cmd))
            self._start(name, cmd)

    def _start(self, name: str, cmd: list[str]) -> None:
        log = self.out / "logs" / f"{name}.log"
        with open(log, "w") as fh:
            # A session of its own: stopping the search stops what it started too.
            proc = subprocess.Popen(
                [sys.executable, "-m", "raysearch.cli", *cmd],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
            )
        self.running[name] = (proc, log, time.monotonic())
        self.spans[name] = (time.time(), time.time())
        self._say(f"{name}: {'resumed' if cmd[0] == 'resume' else 'started'}")

    def _ended(self, name: str) -> None:
        del self.running[name]
        self.spans[name] = (self.spans[name][0], time.time())

    def stop_all(self) -> None:
        for name, (proc, _, _) in list(self.running.items()):
            _stop(proc)
            self._ended(name)


#: How long a model waits for a leftover search that holds its folder.
_HELD_WAIT_S = 180.0

#: Seconds a search of a batch waits for the Ray the batch started once it stopped answering
#: (it ends only with the batch; a joined cluster's searches keep Ray's default 60 s).
LOCAL_RAY_LOST_S = 10


def local_ray_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with Ray's
    ``gcs_rpc_server_reconnect_timeout_s`` at :data:`LOCAL_RAY_LOST_S`, unless it sets it.

    Example:
        >>> local_ray_env({})["RAY_gcs_rpc_server_reconnect_timeout_s"]
        '10'
    """
    env = dict(os.environ if environ is None else environ)
    env.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(LOCAL_RAY_LOST_S))
    return env


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Interrupt a search (Ctrl-C: it records what finished and exits), then kill it."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    """The last error line a search process wrote: its one-line message."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if line.startswith("raysearch: "):
            return line[len("raysearch: ") :]
    return lines[-1] if lines else "exited without output"


def say(stream: TextIO | None, text: str) -> None:
    _logger.info(text)
    if stream is not None:
        print(f"[batch] {text}", file=stream, flush=True)
