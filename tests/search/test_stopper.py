"""CandidateStopper on its own: each condition, its reason, disabled conditions, carry-over."""

from __future__ import annotations

import time

import pytest
from ray.tune.stopper import Stopper

from raysearch.config import StopConfig
from raysearch.search.record.reported import pack_record
from raysearch.search.tune.stopper import STOP_REASONS, CandidateStopper
from raysearch.trialrecord import TrialRecord


def ok(metric: float, candidate: bool, trial_id: str | None = None) -> TrialRecord:
    return TrialRecord(trial_id=trial_id, metric=metric, is_candidate=candidate, status="ok")


def test_is_a_tune_stopper_that_never_stops_single_trials():
    stopper = CandidateStopper(StopConfig(), higher_is_better=False)
    assert isinstance(stopper, Stopper)
    # Tune's result carries the record as JSON text.
    assert stopper("a", {"metric": 0.1, "done": True, "trial": pack_record(ok(0.1, True))}) is False
    assert stopper.n_finished == stopper.n_candidates == 1
    assert not stopper.stop_all() and stopper.reason is None


def test_find_n_candidates_counts_each_trial_once():
    stopper = CandidateStopper(StopConfig(find_n_candidates=2), higher_is_better=False)
    stopper.observe("a", ok(0.1, True))
    stopper.observe("a", ok(0.1, True))  # the same trial told twice is one candidate
    stopper.observe("b", ok(0.9, False))
    assert not stopper.stop_all()
    stopper.observe("c", ok(0.2, True))
    assert stopper.stop_all() and stopper.reason == "candidates_found"
    assert stopper.n_candidates == 2 and stopper.n_finished == 3


@pytest.mark.parametrize(
    ("higher", "target", "metrics", "stops"),
    [
        (False, 0.01, [0.02, 0.011], False),
        (False, 0.01, [0.02, 0.01], True),
        (True, 0.999, [0.99, 0.9985], False),
        (True, 0.999, [0.99, 0.9995], True),
    ],
)
def test_find_best_candidate_respects_the_metric_direction(higher, target, metrics, stops):
    stopper = CandidateStopper(StopConfig(find_best_candidate=target), higher_is_better=higher)
    for i, metric in enumerate(metrics):
        stopper.observe(str(i), ok(metric, True))
    assert stopper.stop_all() is stops
    assert stopper.reason == ("best_candidate_found" if stops else None)


def test_best_candidate_must_be_a_candidate():
    stopper = CandidateStopper(StopConfig(find_best_candidate=0.01), higher_is_better=False)
    stopper.observe("a", ok(0.001, False))  # reaches the target but is outside the tolerance
    assert not stopper.stop_all()


def test_iteration_limit_counts_finished_trials_failed_ones_included():
    stopper = CandidateStopper(StopConfig(iteration_limit=3), higher_is_better=False)
    stopper("a", {"metric": 0.1})
    stopper.observe("b", TrialRecord(status="failed"))
    assert not stopper.stop_all()
    stopper.observe("c", ok(0.3, False))
    assert stopper.stop_all() and stopper.reason == "iteration_limit"


def test_time_limit_counts_wall_time_and_earlier_sessions():
    # The session's start is given, not waited for: a loaded machine cannot make it flaky.
    fresh = CandidateStopper(StopConfig(time_limit=3600), higher_is_better=False)
    assert not fresh.stop_all() and fresh.reason is None
    began = time.monotonic() - 3601
    stopper = CandidateStopper(
        StopConfig(time_limit=3600), higher_is_better=False, started_at=began
    )
    assert stopper.stop_all() and stopper.reason == "time_limit"
    resumed = CandidateStopper(
        StopConfig(time_limit=10), higher_is_better=False, elapsed_before_s=10.5
    )
    assert resumed.stop_all() and resumed.reason == "time_limit"
    assert resumed.elapsed_s >= 10.5


def test_disabled_conditions_never_stop():
    stop = StopConfig(find_n_candidates=-1, find_best_candidate=None, iteration_limit=-1)
    stopper = CandidateStopper(stop, higher_is_better=True)
    for i in range(50):
        stopper.observe(str(i), ok(1.0, True))
    assert not stopper.stop_all()


def test_prior_results_carry_over_and_the_first_reason_sticks():
    prior = [ok(0.1, True, "a"), ok(0.2, True, "b")]
    stopper = CandidateStopper(
        StopConfig(find_n_candidates=3, iteration_limit=3), higher_is_better=False, prior=prior
    )
    assert stopper.n_candidates == 2 and not stopper.stop_all()
    stopper.observe("c", ok(0.3, True))  # three candidates and three trials: both hold at once
    assert stopper.stop_all() and stopper.reason == "candidates_found"
    stopper.observe("d", ok(0.3, False))
    assert stopper.stop_all() and stopper.reason == "candidates_found"
    assert stopper.reason in STOP_REASONS
