"""Where a search's log records go: ``auto_search.log`` in the output folder, and what of Ray
Tune's own logging is silenced."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from raysearch.errors import DiskFullError, is_disk_full
from raysearch.layout import LOG_FILE

__all__ = ["LogSetup", "quiet_tune", "check_tune_disk"]

#: Ray Tune's logger for saving its experiment state (to the output folder by default).
_TUNE_STATE_LOGGER = "ray.tune.execution.experiment_state"


class _LogFile(logging.FileHandler):
    """``auto_search.log``, whose records are dropped silently on a full disk (the search
    reports it in one line of its own)."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not is_disk_full(sys.exc_info()[1]):
            super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            if not is_disk_full(exc):
                raise


class _TuneDiskFull(logging.Filter):
    """Keeps Ray Tune's traceback of a state save that failed on a full disk off the console,
    and notes it."""

    def __init__(self) -> None:
        super().__init__()
        self.error: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if is_disk_full(exc) or "No space left on device" in record.getMessage():
            self.error = "Ray Tune could not save its experiment state: no space left on device"
            return False
        return True


_TUNE_DISK = _TuneDiskFull()

#: Ray Tune's loggers of its notes that a step of its own loop took long (each with this
#: word): ``auto_search.log`` keeps them, the terminal does not show them.
_TUNE_SLOW = ("ray.tune.utils.util", "ray.tune.execution.tune_controller", _TUNE_STATE_LOGGER)
_SLOW_WORD = "bottleneck"
#: Ray Tune's reports of a trial's failure, with Ray's traceback: ``auto_search.log`` keeps
#: them; the terminal has raysearch's line for each failed trial and node lost.
_TUNE_FAILURES = {
    "ray.tune.execution.tune_controller": "Trial task failed for trial",
    "ray.tune.tune": "Trials did not complete",
}


class _ToLogOnly(logging.Filter):
    """Hands a record whose message holds ``words`` to ``auto_search.log``'s handler alone."""

    def __init__(self, handler: logging.Handler, words: str) -> None:
        super().__init__()
        self.handler, self.words = handler, words

    def filter(self, record: logging.LogRecord) -> bool:
        if self.words not in record.getMessage():
            return True
        if record.levelno >= self.handler.level:
            self.handler.handle(record)
        return False


def check_tune_disk() -> None:
    """Raise :class:`DiskFullError` when Ray Tune's last state save failed on a full disk."""
    if _TUNE_DISK.error:
        raise DiskFullError(_TUNE_DISK.error)


class LogSetup:
    """``auto_search.log`` gets every ``raysearch`` record from INFO on (DEBUG when the logger
    is set to it) and Ray Tune's; the console keeps its verbosity."""

    def __init__(self, folder: Path) -> None:
        self.handler = _LogFile(folder / LOG_FILE, encoding="utf-8")
        self.handler.setLevel(logging.DEBUG)
        self.handler.setFormatter(
            logging.Formatter(
                "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
            )
        )
        self.logger = logging.getLogger("raysearch")
        self.level = self.logger.level
        root = logging.getLogger()
        self.pinned = []
        if self.logger.getEffectiveLevel() > logging.INFO:
            for handler in root.handlers:
                if handler.level == logging.NOTSET:
                    handler.setLevel(root.level)
                    self.pinned.append(handler)
            self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)
        logging.getLogger("ray.tune").addHandler(self.handler)
        self.routed = [(name, _ToLogOnly(self.handler, _SLOW_WORD)) for name in _TUNE_SLOW]
        self.routed += [(n, _ToLogOnly(self.handler, w)) for n, w in _TUNE_FAILURES.items()]
        for name, routed in self.routed:
            logging.getLogger(name).addFilter(routed)

    def close(self) -> None:
        for name, routed in self.routed:
            logging.getLogger(name).removeFilter(routed)
        self.logger.removeHandler(self.handler)
        logging.getLogger("ray.tune").removeHandler(self.handler)
        self.logger.setLevel(self.level)
        for handler in self.pinned:
            handler.setLevel(logging.NOTSET)
        self.handler.close()


@contextlib.contextmanager
def quiet_tune() -> Iterator[None]:
    """Silence Tune's notes raysearch makes moot (result files, end of run) and its traceback
    on a full disk (:func:`check_tune_disk` then raises)."""
    names = ("ray.tune.analysis.experiment_analysis", "ray.tune.tune", "ray.tune.result_grid")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    _TUNE_DISK.error = None
    state = logging.getLogger(_TUNE_STATE_LOGGER)
    state.addFilter(_TUNE_DISK)
    try:
        yield
    finally:
        state.removeFilter(_TUNE_DISK)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
