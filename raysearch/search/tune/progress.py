"""Live progress of a search as one compact line: on a terminal redrawn in place, into a file
or pipe one every ``every`` finished trials (once Tune refilled the freed slots, or after
:data:`SETTLE_S`), without a stream to the logger at INFO.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> progress = ProgressCallback(out, metric="L2", higher_is_better=False, every=1)
    >>> progress.trial_finished("ok", 0.02, True)
    >>> out.getvalue().split(" | ")[0]
    'trials 1 done, 0 running, 0 failed'
"""

from __future__ import annotations

import logging
import time
from typing import Any, TextIO

from ray import tune

from raysearch.ranking import finite, is_candidate, is_probe, stopped_at_rung
from raysearch.search.record.reported import reported_record
from raysearch.trialrecord import TrialRecord

__all__ = ["ProgressCallback"]

_logger = logging.getLogger("raysearch.progress")

#: Seconds a due line on a file or pipe waits for Tune to start trials in the slots just freed.
SETTLE_S = 0.5


class ProgressCallback(tune.Callback):
    """A Ray Tune ``Callback`` printing trials done/running/failed, candidates, the best
    metric so far and the elapsed time. ``*_before``: what earlier sessions took and counted;
    ``started_at``: this session's start (``time.monotonic()``), the stopper's clock."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        metric: str = "metric",
        higher_is_better: bool = False,
        total: int | None = None,
        every: int = 10,
        elapsed_before_s: float = 0.0,
        started_at: float | None = None,
        done_before: int = 0,
        failed_before: int = 0,
        candidates_before: int = 0,
        best_before: float | None = None,
    ) -> None:
        self.stream = stream
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.total = total
        self.every = max(1, every)
        self.elapsed_before_s = elapsed_before_s
        self.done = done_before
        self.failed = failed_before
        self.candidates = candidates_before
        self.best = best_before
        self.running: set[str] = set()
        self._start = time.monotonic() if started_at is None else started_at
        self._last_draw = float("-inf")
        self._last_count = -1
        self._tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._drawn = False
        self._done_before = done_before
        #: When the running trials last changed, and the count that refills the freed slots.
        self._changed_at = time.monotonic()
        self._refill = 0

    def trial_finished(
        self, status: str, metric: float | None, is_candidate: bool, *, freed_slot: bool = False
    ) -> None:
        """Count one finished trial and redraw; ``freed_slot``: it was running."""
        if freed_slot:
            self._refill = max(self._refill, len(self.running) + 1)
        self.done += 1
        if status != "ok":
            self.failed += 1
        if is_candidate:
            self.candidates += 1
        value = finite(metric) if status == "ok" else None
        if value is not None and (
            self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        ):
            self.best = value
        self.draw()

    def line(self) -> str:
        elapsed = self.elapsed_before_s + time.monotonic() - self._start
        total = f"/{self.total}" if self.total else ""
        best = "-" if self.best is None else f"{self.best:.6g}"
        return (
            f"trials {self.done}{total} done, {len(self.running)} running, {self.failed} failed"
            f" | candidates {self.candidates} | best {self.metric} {best} | {_clock(elapsed)}"
        )

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            if not force and now - self._last_draw < 0.2:
                return
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
            self._drawn = True
        else:
            if not force and not self._line_ready(now):
                return
            self._last_count = self.done
            self._refill = 0
            if self.stream is not None:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
            else:
                _logger.info("%s", self.line())
        self._last_draw = now

    def _line_ready(self, now: float) -> bool:
        """Whether a line on a file or pipe is due now (see the module docstring)."""
        if self._last_count < 0 and self.done == self._done_before:
            return bool(self.running) and now - self._changed_at >= SETTLE_S
        last = max(self._last_count, self._done_before)
        if self.done // self.every <= last // self.every:
            return False
        return len(self.running) >= self._refill or now - self._changed_at >= SETTLE_S

    def close(self) -> None:
        if self._tty or self.done != self._last_count:
            self.draw(force=True)
        if self._tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self._changed_at = time.monotonic()
        self.draw()

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if result.get("done", True) is False:
            return  # a rung before the last: the trial goes on
        freed = self._stopped(trial)
        record = reported_record(result) or TrialRecord()
        # A trial stopped at a rung, or a sensitivity probe, is never the best.
        ranked = stopped_at_rung(record) is None and not is_probe(record)
        self.trial_finished(
            record.status,
            result.get("metric") if ranked else None,
            is_candidate(record),
            freed_slot=freed,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        freed = self._stopped(trial)
        self.trial_finished("failed", None, False, freed_slot=freed)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._stopped(trial)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.draw()  # a terminal's clock, or a line that waited for the slots to refill

    def _stopped(self, trial: Any) -> bool:
        """Take ``trial`` off the running ones; whether it was running."""
        if trial.trial_id not in self.running:
            return False
        self.running.discard(trial.trial_id)
        self._changed_at = time.monotonic()
        return True

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.close()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
