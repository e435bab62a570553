"""One meaning of "candidate" (``raysearch.ranking.is_candidate``): a complete trial within the
tolerance that quantizes something. A record whose field says candidate but that failed is no
candidate for the strategies, the stop conditions, the loggers or the progress line alike."""

from __future__ import annotations

import pytest

from raysearch.config._config import StopConfig
from raysearch.ranking import is_candidate
from raysearch.search.record.reported import pack_record
from raysearch.search.tune._loggers import logged_result
from raysearch.search.tune._told import candidacy
from raysearch.search.tune.stopper import CandidateStopper
from raysearch.strategies._setting_phase import meets_tolerance
from raysearch.trialrecord import TrialRecord

CANDIDATE = TrialRecord(status="ok", metric=0.01, is_candidate=True)
#: Field set on a failed trial.
FAILED = CANDIDATE.replace(status="failed")


@pytest.mark.parametrize(
    "record, expected", [(CANDIDATE, True), (FAILED, False)], ids=["candidate", "failed"]
)
def test_every_reader_agrees_with_the_one_rule(record, expected):
    assert is_candidate(record) is expected
    # The strategies (Fallback's bisection reads meets_tolerance; a setting that quantizes
    # nothing meets the tolerance only by its own within_tolerance flag).
    assert meets_tolerance(record) is expected
    # The stop conditions (find_n_candidates).
    stopper = CandidateStopper(StopConfig(find_n_candidates=1), higher_is_better=False)
    stopper.observe("t", record)
    assert stopper.n_candidates == int(expected)
    assert stopper.stop_all() is expected
    # What the searcher is told of a finished trial (the phases' records).
    assert candidacy({"trial": pack_record(record)})[0] is expected
    # What the loggers (TensorBoard, CSV, MLflow, W&B) are given.
    logged = logged_result({"metric": 0.01, "trial": pack_record(record)}, {})
    assert logged["is_candidate"] is expected
