"""The durable record of a search: one JSON line per finished trial, written the moment it ends.

Ray Tune saves its experiment state only every so often (raysearch sets a long period, because
saving it after every trial would cost more than a small trial itself). The journal fills the
gap: the driver appends each finished trial (``ok`` or ``failed``) to ``journal.jsonl`` in the
output folder, flushed and ``fsync``-ed before the search goes on. On resume, a trial that Tune
would run again but whose id is in the journal is answered from it instead of recomputed, and a
trial finished after Tune's last save is known to the searcher and to the stop conditions.

``state.json`` beside it holds the wall time spent by each session of the search, refreshed
every few seconds, so ``time_limit`` counts the time of an interrupted session too.

Example:
    >>> import pathlib, tempfile
    >>> journal = Journal(pathlib.Path(tempfile.mkdtemp()) / "journal.jsonl")
    >>> journal.append({"trial_id": "a1", "key": "{...}", "status": "ok", "metric": 0.1})
    >>> [r["trial_id"] for r in Journal(journal.path).load()]
    ['a1']
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raysearch.fileio import atomic_write_text
from raysearch.ranking import is_candidate
from raysearch.space.space import json_default, settings_key

__all__ = ["Journal", "SessionClock", "settings_key", "atomic_write_text", "json_default"]

_logger = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    """NaN and infinities as None: the journal is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class Journal:
    """Append-only JSON-lines file of finished trials, durable line by line."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fh = None

    def load(self) -> list[dict[str, Any]]:
        """Every complete record, in the order written. A torn last line (the process died
        while writing it) is ignored, and so is a repeated trial id (the first one wins). A
        record a trial called a candidate though it quantizes nothing (written before such a
        trial stopped being one: :func:`raysearch.ranking.is_candidate`) reads as no candidate,
        so that a resumed search counts, replays and keeps its trials as it would now."""
        records: list[dict[str, Any]] = []
        seen: set[str] = set()
        for record in self._lines():
            trial_id = record.get("trial_id")
            if trial_id in seen:
                continue
            seen.add(trial_id)
            if record.get("is_candidate") and not is_candidate(record):
                record["is_candidate"] = False
            records.append(record)
        return records

    def _lines(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    _logger.warning("%s:%d: ignoring a torn record", self.path, number)
                    continue
                if isinstance(record, dict) and "trial_id" in record:
                    yield record

    def append(self, record: dict[str, Any]) -> None:
        """Write one record and make it durable (flush + fsync) before returning."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_tail()
            self._fh = open(self.path, "a", encoding="utf-8")
        line = json.dumps(_clean(record), default=json_default, allow_nan=False)
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def _repair_tail(self) -> None:
        """End a torn last line with a newline so the next record starts on its own line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fh": None}


class SessionClock:
    """Wall time per session of one search, kept in ``state.json`` (atomic rewrites).

    ``elapsed_before_s`` is the time of every earlier session (an interrupted one included, up
    to its last refresh); :meth:`tick` records this session's time at most every ``period_s``.
    ``started_at`` (``time.monotonic()``) is when this session began, if before now (the checks
    that ran before the output folder existed count too).
    """

    def __init__(
        self, path: str | os.PathLike, period_s: float = 2.0, *, started_at: float | None = None
    ) -> None:
        self.path = Path(path)
        self.period_s = period_s
        self.sessions: list[dict[str, float]] = []
        if self.path.exists():
            try:
                self.sessions = list(json.loads(self.path.read_text()).get("sessions", []))
            except (OSError, ValueError):
                _logger.warning("%s: unreadable, elapsed time of earlier sessions lost", self.path)
        self.elapsed_before_s = float(sum(s.get("elapsed_s", 0.0) for s in self.sessions))
        self._start = time.monotonic() if started_at is None else started_at
        self._last = float("-inf")
        self._current = {"started_at": time.time() - self.session_s, "elapsed_s": 0.0}
        self.sessions.append(self._current)

    def at_least(self, elapsed_before_s: float) -> None:
        """Earlier sessions took at least ``elapsed_before_s`` (the journal's last record says
        so): count the time an interrupted session spent after its last refresh."""
        missing = float(elapsed_before_s) - self.elapsed_before_s
        if missing > 0 and len(self.sessions) > 1:
            previous = self.sessions[-2]
            previous["elapsed_s"] = round(float(previous.get("elapsed_s", 0.0)) + missing, 3)
            self.elapsed_before_s += missing

    @property
    def started_at(self) -> float:
        """When this session began, on the ``time.monotonic()`` clock."""
        return self._start

    @property
    def session_s(self) -> float:
        return time.monotonic() - self._start

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_before_s + self.session_s

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.period_s:
            return
        self._last = now
        self._current["elapsed_s"] = round(self.session_s, 3)
        atomic_write_text(self.path, json.dumps({"sessions": self.sessions}, indent=1))
