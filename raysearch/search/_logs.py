"""Where a search's log records go: ``auto_search.log`` in the output folder, and what of Ray
Tune's own logging is silenced.

Example:
    >>> log = LogSetup(folder)        # doctest: +SKIP
    >>> with quiet_tune():            # doctest: +SKIP
    ...     tuner.fit()
    >>> log.close()                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from raysearch.search.layout import LOG_FILE

__all__ = ["LogSetup", "quiet_tune"]


class LogSetup:
    """``auto_search.log`` gets every ``raysearch`` record from INFO on (DEBUG when the
    ``raysearch`` logger is set to it), while the console keeps the verbosity its owner chose:
    a root handler without a level of its own gets the root logger's level for the search."""

    def __init__(self, folder: Path) -> None:
        self.handler = logging.FileHandler(folder / LOG_FILE, encoding="utf-8")
        self.handler.setLevel(logging.DEBUG)
        self.handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
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

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        logging.getLogger("ray.tune").removeHandler(self.handler)
        self.logger.setLevel(self.level)
        for handler in self.pinned:
            handler.setLevel(logging.NOTSET)
        self.handler.close()


@contextlib.contextmanager
def quiet_tune() -> Iterator[None]:
    """Silence what Tune logs that raysearch makes moot: the per-trial result files it no
    longer writes (raysearch keeps its own), and its end-of-run notes."""
    names = ("ray.tune.analysis.experiment_analysis", "ray.tune.tune", "ray.tune.result_grid")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
