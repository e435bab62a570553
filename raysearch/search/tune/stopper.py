"""``CandidateStopper``: the stop conditions of ``stop:`` as one Ray Tune ``Stopper`` (not
Tune's ``TimeoutStopper``/``CombinedStopper``: ``time_limit`` counts earlier sessions too, and
the search must know which condition fired, :attr:`CandidateStopper.reason`).

Example:
    >>> stopper = CandidateStopper(StopConfig(find_n_candidates=2), higher_is_better=False)
    >>> from raysearch.search.record.reported import pack_record
    >>> a = TrialRecord(status="ok", metric=0.1, is_candidate=True)
    >>> stopper("a", {"metric": 0.1, "trial": pack_record(a)}), stopper.stop_all()
    (False, False)
    >>> stopper.observe("b", a.replace(metric=0.2))  # as the recorder tells it
    >>> stopper.stop_all(), stopper.reason
    (True, 'candidates_found')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ray.tune.stopper import Stopper

from raysearch.config import StopConfig
from raysearch.ranking import finite, is_candidate
from raysearch.search.record.reported import reported_record
from raysearch.trialrecord import TrialRecord

__all__ = ["CandidateStopper", "STOP_REASONS", "trial_limit"]

_logger = logging.getLogger(__name__)

#: Every value ``summary.json``'s ``stop_reason`` can take.
STOP_REASONS = (
    "candidates_found",
    "best_candidate_found",
    "iteration_limit",
    "time_limit",
    "space_exhausted",
    "strategy_failed",
    "interrupted",
)


def _enabled(value: float | int | None) -> bool:
    return value is not None and value != -1


def trial_limit(stop: StopConfig) -> int | None:
    """The most trials a search starts (``stop.iteration_limit``), None for no limit.

    Example:
        >>> trial_limit(StopConfig(iteration_limit=20)), trial_limit(StopConfig())
        (20, None)
    """
    limit = stop.iteration_limit
    return limit if limit is not None and limit > 0 else None


class CandidateStopper(Stopper):
    """Ends the whole search on the first stop condition of ``stop`` that holds, counting
    the ``prior`` records and ``elapsed_before_s`` of earlier sessions; ``started_at``: this
    session's start (``time.monotonic()``)."""

    def __init__(
        self,
        stop: StopConfig,
        *,
        higher_is_better: bool,
        elapsed_before_s: float = 0.0,
        prior: Iterable[TrialRecord] = (),
        started_at: float | None = None,
    ) -> None:
        self.stop = stop
        self.higher_is_better = higher_is_better
        self.elapsed_before_s = float(elapsed_before_s)
        self.reason: str | None = None
        self._start = time.monotonic() if started_at is None else started_at
        self._finished: set[str] = set()
        self._candidates: set[str] = set()
        self._best_hit: str | None = None
        for record in prior:
            self.observe(str(record.trial_id), record)

    @property
    def elapsed_s(self) -> float:
        """Wall time of the search so far: earlier sessions plus this one."""
        return self.elapsed_before_s + (time.monotonic() - self._start)

    @property
    def n_finished(self) -> int:
        return len(self._finished)

    @property
    def n_candidates(self) -> int:
        return len(self._candidates)

    def observe(self, trial_id: str, result: TrialRecord) -> None:
        """Count one finished trial's result (a trial id is counted once)."""
        self._finished.add(trial_id)
        if not is_candidate(result) or result.stopped_at_rung is not None:
            return
        self._candidates.add(trial_id)
        target = self.stop.find_best_candidate
        metric = finite(result.metric)
        if (
            _enabled(target)
            and self._best_hit is None
            and metric is not None
            and (metric >= target if self.higher_is_better else metric <= target)
        ):
            self._best_hit = trial_id

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Count a trial's last report (``done``); never stops a single trial. One ASHA
        stops at a rung is counted when recorded (:meth:`observe`), never as a candidate."""
        if result.get("done", True) is False:
            return False
        self.observe(trial_id, reported_record(result) or TrialRecord())
        return False

    def end(self, reason: str) -> None:
        """End the whole search at Tune's next check, for ``reason``."""
        if self.reason is None:
            self.reason = reason

    def stop_all(self) -> bool:
        """Whether the whole search ends now; sets :attr:`reason` the first time it does."""
        if self.reason is not None:
            return True
        stop = self.stop
        if self._best_hit is not None:
            self.reason = "best_candidate_found"
        elif _enabled(stop.find_n_candidates) and self.n_candidates >= stop.find_n_candidates:
            self.reason = "candidates_found"
        elif (limit := trial_limit(stop)) is not None and self.n_finished >= limit:
            self.reason = "iteration_limit"
        elif _enabled(stop.time_limit) and self.elapsed_s >= stop.time_limit:
            self.reason = "time_limit"
        else:
            return False
        _logger.info(
            "stop condition met: %s (%d trials finished, %d candidates, %.1f s)",
            self.reason,
            self.n_finished,
            self.n_candidates,
            self.elapsed_s,
        )
        return True
