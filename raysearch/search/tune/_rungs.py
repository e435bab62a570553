"""Evaluation on growing subsets, on Ray Tune: :class:`RungScheduler` is Tune's ASHA with one
bracket whose milestones are the rungs (rung ``k`` reports ``rung_clock = r**k``), its rungs
filled from the journal on resume, a trial within :data:`~raysearch.evaluate.subsets.TIE_Z`
standard errors of the cutoff kept. It ranks ``rung_score`` ("higher is better"); a trial that
could still become a candidate reports :data:`PROTECTED`, above any cutoff.

Example:
    >>> rung_clock(2, 3.0), stopped_at_rung(TrialRecord(status="ok", rung=1, rungs=3))
    (9.0, 1)
    >>> stopped_at_rung(TrialRecord(status="ok", rung=2, rungs=3)) is None
    True
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from raysearch.evaluate.subsets import TIE_Z, EvalRungs, plan_rungs
from raysearch.ranking import finite, stopped_at_rung
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.search.preflight import Prepared

__all__ = [
    "RUNG_CLOCK",
    "RUNG_SCORE",
    "RUNG_ERROR",
    "UNRANKED",
    "PROTECTED",
    "RungScheduler",
    "rung_clock",
    "rung_score",
    "plan_search_rungs",
    "early_stopping_summary",
]

_logger = logging.getLogger("raysearch.search")

#: The result keys ASHA reads: its time attribute and its metric.
RUNG_CLOCK = "rung_clock"
RUNG_SCORE = "rung_score"
#: The standard error of a rung's score (see :data:`raysearch.evaluate.subsets.TIE_Z`).
RUNG_ERROR = "rung_error"
#: What a result that ASHA does not rank holds (Tune wants both keys in every result).
UNRANKED: dict[str, None] = {RUNG_CLOCK: None, RUNG_SCORE: None, RUNG_ERROR: None}
#: The score of a trial that could still become a candidate: above every cutoff (finite, so
#: that ASHA's percentile of many of them stays a number).
PROTECTED = 1e300


def rung_clock(rung: int, reduction_factor: float) -> float:
    """ASHA's time of ``rung``: its milestones are ``grace_period * r**k``, grace period 1."""
    return float(1 * reduction_factor**rung)


def rung_score(record: TrialRecord, higher_is_better: bool) -> float | None:
    """What ASHA ranks a trial's rung by (None: a failed trial, which ASHA never sees)."""
    metric = record.metric
    if record.status != "ok" or not isinstance(metric, (int, float)):
        return None
    if record.could_be_candidate:
        return PROTECTED
    return float(metric) if higher_is_better else -float(metric)


@dataclass
class _Stub:
    """What ASHA reads of a trial: its id (a journaled trial replayed into the rungs)."""

    trial_id: str


class RungScheduler(AsyncHyperBandScheduler):
    """Tune's ASHA over the rungs of ``rungs`` (see the module docstring), its rungs filled
    with the scores of ``records`` (the journal's, on resume)."""

    def __init__(self, rungs: EvalRungs, records: Iterable[TrialRecord] = ()) -> None:
        factor = rungs.reduction_factor
        #: The last rung's clock (a trial there is done: no near-tie to keep going).
        self.max_clock = rung_clock(len(rungs) - 1, factor)
        super().__init__(
            time_attr=RUNG_CLOCK,
            metric=RUNG_SCORE,
            mode="max",
            grace_period=1,
            max_t=self.max_clock,
            reduction_factor=factor,
            brackets=1,
        )
        self.n_rungs = len(rungs)
        self.factor = factor
        seeded = self.seed(records)
        if seeded:
            _logger.info("early stopping: %d rung results of earlier sessions", seeded)

    def seed(self, records: Iterable[TrialRecord]) -> int:
        """Put the rung scores of finished trials into the rungs in the order reported; how many."""
        events = []
        for record in records:
            scores = record.rung_scores or []
            times = record.rung_ended_at or []
            trial_id = str(record.trial_id)
            # The last rung decides nothing (a trial there is done): only those before.
            for k, score in enumerate(scores[: self.n_rungs - 1]):
                if finite(score) is not None:
                    when = times[k] if k < len(times) else math.inf
                    events.append((when, k, trial_id, float(score)))
        events.sort(key=lambda e: (e[0], e[1]))
        stubs = {trial_id: _Stub(trial_id) for _, _, trial_id, _ in events}
        for stub in stubs.values():
            super().on_trial_add(None, stub)  # type: ignore[arg-type]
        for _, k, trial_id, score in events:
            result = {RUNG_CLOCK: rung_clock(k, self.factor), RUNG_SCORE: score}
            super().on_trial_result(None, stubs[trial_id], result)  # type: ignore[arg-type]
        for stub in stubs.values():
            super().on_trial_remove(None, stub)  # type: ignore[arg-type]
        return len(events)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if not _ranked(result):  # a failure, which ends its trial anyway
            return TrialScheduler.CONTINUE
        cutoff = self._cutoff(trial.trial_id, float(result[RUNG_CLOCK]))
        action = super().on_trial_result(tune_controller, trial, result)
        error = result.get(RUNG_ERROR)
        if (
            action == TrialScheduler.STOP
            and cutoff is not None
            and finite(error) is not None
            and float(result[RUNG_SCORE]) + TIE_Z * float(error) >= cutoff
        ):
            # A near-tie is noise on the rows seen: the next rung, on more rows, decides.
            self._num_stopped -= 1
            _logger.debug(
                "early stopping: trial %s kept (%.6g within %g standard errors of the cutoff %.6g)",
                trial.trial_id,
                result[RUNG_SCORE],
                TIE_Z,
                cutoff,
            )
            return TrialScheduler.CONTINUE
        return action

    def _cutoff(self, trial_id: str, clock: float) -> float | None:
        """ASHA's cutoff at the rung of ``clock`` before ``trial_id``'s score joins it; None
        when the rung is empty or the last."""
        for milestone, recorded in self._brackets[0]._rungs:
            if clock >= milestone:
                if trial_id in recorded or clock >= self.max_clock:
                    return None
                cutoff = self._brackets[0].cutoff(recorded)
                return None if cutoff is None else float(cutoff)
        return None

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        if _ranked(result):
            self._trial_info.setdefault(trial.trial_id, self._brackets[0])
            super().on_trial_complete(tune_controller, trial, result)
        self._trial_info.pop(trial.trial_id, None)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self._trial_info.pop(trial.trial_id, None)


def _ranked(result: Mapping[str, Any]) -> bool:
    """Whether a result carries a rung and a score (a failed one holds None)."""
    clock, score = result.get(RUNG_CLOCK), result.get(RUNG_SCORE)
    return isinstance(clock, (int, float)) and isinstance(score, (int, float))


def plan_search_rungs(
    config: SearchConfig, prepared: Prepared
) -> tuple[EvalRungs | None, dict[str, Any]]:
    """The rungs of ``config``'s search (None: none) and ``summary.json``'s ``early_stopping``."""
    settings = config.early_stopping
    if not settings.enabled:
        return None, {"enabled": False, "why": "early_stopping: false"}
    rungs, why = plan_rungs(
        settings.rungs,
        evaluator=prepared.evaluator,
        evaluation=prepared.evaluation,
        # A reference still being computed: its first batch says where the rows are.
        reference=prepared.reference or prepared.probe,
        reference_rows=None if prepared.reference is not None else _probe_rows(prepared),
        seed=config.seed if config.seed is not None else 0,
        min_rows=settings.min_rows,
        reduction_factor=settings.reduction_factor,
    )
    if rungs is None:
        _logger.info("early stopping is off: %s", why)
        return None, {"enabled": False, "why": why}
    described = rungs.describe()
    _logger.info(
        "early stopping: rungs %s%s, the best 1/%g of each rung go on",
        described["rungs"],
        f" ({described['rung_rows']} rows)" if "rung_rows" in described else "",
        rungs.reduction_factor,
    )
    return rungs, {"enabled": True, **described}


def _probe_rows(prepared: Prepared) -> int | None:
    """The rows of the float reference's first batch (``prepared.probe``)."""
    from raysearch.search._pending_reference import first_batch_range

    if prepared.probe is None:
        return None
    first, last = first_batch_range(prepared.evaluation)
    return last - first


def early_stopping_summary(
    plan: Mapping[str, Any], records: Iterable[TrialRecord]
) -> dict[str, Any]:
    """``summary.json``'s ``early_stopping``: the plan, the trials stopped at a rung, and the
    rows evaluated against every trial on every row.

    Example:
        >>> early_stopping_summary({"enabled": True, "rung_rows": [10, 100]}, [
        ...     TrialRecord(status="ok", eval_rows=10, rung=0, rungs=2),
        ...     TrialRecord(status="ok", eval_rows=100, rung=1, rungs=2)])["rows_evaluated"]
        110
    """
    out = dict(plan)
    if not out.get("enabled"):
        return out
    evaluated = [r for r in records if r.ok]
    out["n_stopped"] = sum(1 for r in evaluated if stopped_at_rung(r) is not None)
    rows = out.get("rung_rows")
    if rows:
        out["rows_evaluated"] = sum(int(r.eval_rows or 0) for r in evaluated)
        out["rows_if_whole"] = len(evaluated) * rows[-1]
    return out
