"""ASHA over the rungs of evaluation on growing subsets, and what the search's parts make of a
trial stopped at a rung (no Ray cluster: Tune's scheduler and raysearch's searcher, stopper
and best rule driven directly)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from ray.tune.schedulers import TrialScheduler

from raysearch.config import StopConfig
from raysearch.evaluate.subsets import EvalRungs
from raysearch.outputs import best_record
from raysearch.search.record.reported import pack_record
from raysearch.search.tune._rungs import (
    PROTECTED,
    RUNG_CLOCK,
    RUNG_ERROR,
    RUNG_SCORE,
    RungScheduler,
    early_stopping_summary,
    rung_clock,
)
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.search.tune.stopper import CandidateStopper
from raysearch.space import SearchSpace
from raysearch.trialrecord import TrialRecord

RUNGS = EvalRungs((0.1, 0.33, 1.0), (40, 132, 400), np.arange(400), reduction_factor=3.0)


@dataclass
class Trial:
    trial_id: str


def _report(scheduler, trial_id: str, rung: int, score: float) -> str:
    result = {RUNG_CLOCK: rung_clock(rung, 3.0), RUNG_SCORE: score}
    return scheduler.on_trial_result(None, Trial(trial_id), result)


def _run(scheduler, scores: dict[str, list[float]]) -> tuple[dict[str, int], list[dict]]:
    """Trials one after another, each reporting rung by rung until ASHA stops it or it
    ends: the rung each ended at, and their records as the journal keeps them."""
    ended, records, clock = {}, [], 0.0
    for trial_id, values in scores.items():
        scheduler.on_trial_add(None, Trial(trial_id))
        kept, times = [], []
        for rung, value in enumerate(values):
            clock += 1
            kept.append(value)
            times.append(clock)
            if rung == len(values) - 1 or _report(scheduler, trial_id, rung, value) == "STOP":
                break
        ended[trial_id] = len(kept) - 1
        records.append(TrialRecord(trial_id=trial_id, rung_scores=kept, rung_ended_at=times))
    return ended, records


SCORES = {f"t{i}": [s, s, s] for i, s in enumerate([0.5, 0.9, 0.2, 0.8, 0.7, 0.1, 0.95, 0.3])}


def test_asha_stops_below_the_top_third_at_the_rungs_milestones():
    scheduler = RungScheduler(RUNGS)
    assert [m for m, _ in scheduler._brackets[0]._rungs][-2:] == [3.0, 1.0]
    ended, _ = _run(scheduler, SCORES)
    # The first trial sets the bar; each later one goes on only in the top third so far.
    assert ended["t0"] == 2 and ended["t1"] == 2 and ended["t6"] == 2
    assert ended["t2"] == 0 and ended["t5"] == 0 and ended["t7"] == 0


def test_a_setting_that_could_be_a_candidate_is_never_stopped():
    scheduler = RungScheduler(RUNGS)
    _run(scheduler, SCORES)
    scheduler.on_trial_add(None, Trial("protected"))
    assert _report(scheduler, "protected", 0, PROTECTED) == TrialScheduler.CONTINUE
    assert _report(scheduler, "protected", 1, PROTECTED) == TrialScheduler.CONTINUE
    # Many protected ones: the cutoff stays a number, and a poor trial is still stopped.
    for i in range(6):
        scheduler.on_trial_add(None, Trial(f"p{i}"))
        assert _report(scheduler, f"p{i}", 0, PROTECTED) == TrialScheduler.CONTINUE
    scheduler.on_trial_add(None, Trial("poor"))
    assert _report(scheduler, "poor", 0, 0.0) == TrialScheduler.STOP


def test_a_near_tie_with_the_cutoff_goes_on_and_a_clear_loss_stops():
    scheduler = RungScheduler(RUNGS)
    _run(scheduler, SCORES)
    bracket = scheduler._brackets[0]

    def report(trial_id: str, below: float, error: float | None, rung: int = 0) -> str:
        """A score ``below`` the rung's cutoff as it stands, with standard error ``error``."""
        scheduler.on_trial_add(None, Trial(trial_id))
        cutoff = bracket.cutoff(bracket._rungs[-1 - rung][1]) or 0.5  # the last: none
        score = cutoff - below
        result = {RUNG_CLOCK: rung_clock(rung, 3.0), RUNG_SCORE: score, RUNG_ERROR: error}
        return scheduler.on_trial_result(None, Trial(trial_id), result)

    stopped = scheduler._num_stopped
    # 0.01 below the cutoff: within 2 standard errors of 0.006, not of 0.004 nor of none.
    assert report("tie", 0.01, 0.006) == TrialScheduler.CONTINUE
    assert scheduler._num_stopped == stopped
    assert report("loss", 0.01, 0.004) == TrialScheduler.STOP
    assert report("no_error", 0.01, None) == TrialScheduler.STOP
    assert scheduler._num_stopped == stopped + 2
    # Above the cutoff it goes on whatever its error; the last rung ends every trial.
    assert report("above", -0.01, 0.0) == TrialScheduler.CONTINUE
    assert report("last", 0.01, 1.0, rung=2) == TrialScheduler.STOP


def test_a_resumed_scheduler_decides_as_the_uninterrupted_one():
    first = dict(list(SCORES.items())[:5])
    later = dict(list(SCORES.items())[5:])
    straight = RungScheduler(RUNGS)
    _, records = _run(straight, first)
    expected, _ = _run(straight, later)
    resumed = RungScheduler(RUNGS)
    assert resumed.seed(records) == sum(min(len(r.rung_scores), 2) for r in records)
    assert _run(resumed, later)[0] == expected
    # Without the journal's scores the decisions differ: the seed is what makes them equal.
    assert _run(RungScheduler(RUNGS), later)[0] != expected


def test_failed_results_are_not_ranked():
    scheduler = RungScheduler(RUNGS)
    _run(scheduler, SCORES)
    scheduler.on_trial_add(None, Trial("failed"))
    failed = {RUNG_CLOCK: None, RUNG_SCORE: None}
    assert scheduler.on_trial_result(None, Trial("failed"), failed) == "CONTINUE"
    scheduler.on_trial_complete(None, Trial("failed"), failed)  # no error, nothing kept
    assert "failed" not in scheduler._brackets[0]._rungs[-1][1]


def test_the_stopper_counts_a_trial_once_at_its_end_and_a_stopped_one_never_as_candidate():
    stopper = CandidateStopper(StopConfig(find_n_candidates=1), higher_is_better=True)
    # A rung before the last, even one within the tolerance on the rows seen, counts nothing.
    within = TrialRecord(status="ok", metric=0.99, is_candidate=True)
    assert stopper("a", {"trial": pack_record(within), "done": False}) is False
    assert stopper.n_finished == 0 and not stopper.stop_all()
    stopper.observe("b", within.replace(stopped_at_rung=0))
    assert stopper.n_finished == 1 and stopper.n_candidates == 0 and not stopper.stop_all()
    stopper("a", {"trial": pack_record(within), "done": True})
    assert stopper.n_candidates == 1 and stopper.stop_all()


def test_the_searcher_is_told_a_stopped_trials_partial_result_and_never_takes_it_as_best():
    space = SearchSpace.parse({"per_channel": [True, False]})
    searcher = SettingSearcher.strategy("TPE", [space], mode="max", seed=0)
    for trial_id in ("full", "stopped"):
        assert isinstance(searcher.suggest(trial_id), dict)
    # What Tune hands the searcher: the last result, the record in it as JSON text.
    full = TrialRecord(status="ok", rung=2, rungs=3)
    searcher.on_trial_complete(
        "full", {"metric": 0.8, "objective": 0.8, "trial": pack_record(full)}
    )
    stopped = TrialRecord(status="ok", rung=0, rungs=3)
    searcher.on_trial_complete(
        "stopped", {"metric": 0.9, "objective": 0.9, "trial": pack_record(stopped)}
    )
    records = {r.trial_id: r for r in searcher.context.records}
    assert records["stopped"].stopped_at_rung == 0 and records["stopped"].metric == 0.9
    assert records["full"].stopped_at_rung is None
    assert searcher.objectives[records["stopped"].key] == 0.9  # the partial objective
    assert best_record(searcher.context.records, higher_is_better=True).trial_id == "full"


def test_the_summary_counts_rows_and_stopped_trials():
    plan = {"enabled": True, "rungs": [0.1, 0.33, 1.0], "rung_rows": [40, 132, 400]}
    records = [
        TrialRecord(status="ok", eval_rows=400, rung=2, rungs=3),
        TrialRecord(status="ok", eval_rows=40, rung=0, rungs=3),
        TrialRecord(status="failed"),
    ]
    summary = early_stopping_summary(plan, records)
    assert summary["n_stopped"] == 1
    assert summary["rows_evaluated"] == 440 and summary["rows_if_whole"] == 800
    assert early_stopping_summary({"enabled": False, "why": "x"}, records) == {
        "enabled": False,
        "why": "x",
    }


@pytest.mark.parametrize("factor", [2.0, 3.0, 3.3, 4.0])
def test_the_milestones_fall_on_the_rungs_for_any_reduction_factor(factor):
    scheduler = RungScheduler(EvalRungs((0.1, 0.33, 0.6, 1.0), reduction_factor=factor))
    milestones = sorted(m for m, _ in scheduler._brackets[0]._rungs)
    assert milestones[:3] == [rung_clock(k, factor) for k in range(3)]
