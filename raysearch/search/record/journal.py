"""The durable record of a search: one JSON line per finished trial, flushed and ``fsync``-ed
the moment it ends; with the saved config, all a resume reads.

Example:
    >>> import pathlib, tempfile
    >>> journal = Journal(pathlib.Path(tempfile.mkdtemp()) / "journal.jsonl")
    >>> journal.append(TrialRecord(trial_id="a1", key="{...}", status="ok", metric=0.1))
    >>> [r.trial_id for r in Journal(journal.path).load()]
    ['a1']
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from raysearch.space.space import json_default
from raysearch.trialrecord import TrialRecord

__all__ = ["Journal", "SessionClock"]

_logger = logging.getLogger(__name__)


class Journal:
    """Append-only JSON-lines file of finished trials, durable line by line."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fh = None

    def load(self) -> list[TrialRecord]:
        """Every complete record, in the order written. A torn last line (the process died
        while writing it) is ignored, and so is a repeated trial id (the first one wins)."""
        records: dict[str, TrialRecord] = {}
        for record in self._lines():
            records.setdefault(record.trial_id, record)
        return list(records.values())

    def _lines(self) -> Iterator[TrialRecord]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    data = json.loads(line)
                    record = TrialRecord.from_dict(data) if isinstance(data, dict) else None
                except (json.JSONDecodeError, TypeError, ValueError) as exc:
                    _logger.warning("%s:%d: ignoring a torn record (%s)", self.path, number, exc)
                    continue
                if record is not None and record.trial_id is not None:
                    yield record

    def append(self, record: TrialRecord) -> None:
        """Write one record and make it durable (flush + fsync) before returning."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_tail()
            self._fh = open(self.path, "a", encoding="utf-8")
        line = json.dumps(record.to_dict(), default=json_default, allow_nan=False)
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


class SessionClock:
    """The search's wall time: ``elapsed_before_s`` (the largest ``elapsed_s`` of the
    journal's ``records``) plus this session's, from ``started_at`` (``time.monotonic()``).

    Example:
        >>> clock = SessionClock([TrialRecord(elapsed_s=12.5), TrialRecord(elapsed_s=30.0)])
        >>> clock.elapsed_before_s, clock.elapsed_s >= 30.0
        (30.0, True)
    """

    def __init__(
        self, records: Iterable[TrialRecord] = (), *, started_at: float | None = None
    ) -> None:
        self.elapsed_before_s = max((r.elapsed_s or 0.0 for r in records), default=0.0)
        self.started_at = time.monotonic() if started_at is None else started_at

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_before_s + time.monotonic() - self.started_at
