"""One typed trial record: made once, serialized only at the edges (the JSON text of a Tune
result, the journal, ``results.parquet``), and read back as the same type, so that the
recorder and the strategies see one shape on a fresh run and on resume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from raysearch.outputs import results_table
from raysearch.outputs._table import RESULT_COLUMNS
from raysearch.search.record.journal import Journal
from raysearch.search.record.recorder import TrialRecorder
from raysearch.search.record.reported import pack_record, reported_record
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace
from raysearch.trialrecord import TrialRecord

#: A record with every kind of field set: the setting, outcome, timings, sizes, rungs, node,
#: errors and extras.
FULL = TrialRecord(
    trial_id="t1",
    number=3,
    phase=1,
    stage="calibration",
    key='{"per_channel": true}',
    point={"per_channel": True},
    params={"per_channel": True, "nodes_to_exclude": ["/a/MatMul"]},
    settings={"per_channel": True, "extra_options": {"CalibPercentile": 99.9}},
    status="ok",
    metric=0.25,
    objective=-1.5,
    is_candidate=True,
    duration_s=1.5,
    calibration_s=0.5,
    quantization_s=0.25,
    evaluation_s=0.75,
    calib_cache_hit=True,
    started_at=1_700_000_000.0,
    ended_at=1_700_000_001.5,
    elapsed_s=12.0,
    model_size_bytes=123_456,
    latency_ms=2.5,
    eval_rows=40,
    eval_fraction=0.5,
    rung=1,
    rungs=2,
    rung_scores=[0.5, 0.25],
    rung_ended_at=[1_700_000_001.0, 1_700_000_001.5],
    rung_metrics=[0.5, 0.25],
    node="10.0.0.1",
    node_id="abc",
    worker_pid=42,
    actor_trials=1,
    model_file="kept/t1.onnx",
    retries=1,
    retried_after="NodeLost: node abc",
    extra={"quantized_share": 1.0, "promoted": 0.0},
)


def test_a_record_round_trips_through_the_tune_result_and_the_journal_unchanged(tmp_path: Path):
    assert reported_record({"trial": pack_record(FULL)}) == FULL
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(FULL)
    journal.close()
    (loaded,) = Journal(journal.path).load()
    assert isinstance(loaded, TrialRecord)
    assert loaded == FULL and loaded.to_dict() == FULL.to_dict()
    # A value the journal cannot hold (strict JSON) reads back as None.
    journal.append(FULL.replace(trial_id="t2", latency_ms=math.nan))
    journal.close()
    assert Journal(journal.path).load()[1].latency_ms is None


def test_a_records_fields_are_its_row_of_results_parquet():
    row = results_table([FULL]).to_pylist()[0]
    for name in RESULT_COLUMNS:
        expected = "ort" if name == "quantizer" else getattr(FULL, name)
        assert row[name] == expected, name
    assert row["params/nodes_to_exclude"] == ["/a/MatMul"]
    assert row["extra/quantized_share"] == 1.0


def test_a_key_that_is_no_field_is_refused_by_name():
    with pytest.raises(ValueError, match="not fields of a trial record: metrc"):
        TrialRecord.from_dict({"status": "ok", "metrc": 0.5})


def test_the_recorder_and_the_strategies_get_the_same_type_fresh_and_on_resume(tmp_path: Path):
    space = SearchSpace.parse({"per_channel": [True, False]})
    # A fresh search: the searcher is told a trial's Tune result, the recorder records it.
    fresh = SettingSearcher.strategy("TPE", [space], mode="max", seed=0)
    config = fresh.suggest("t0")
    trial = TrialRecord(status="ok", metric=0.5, is_candidate=True, model_size_bytes=10)
    fresh.on_trial_complete("t0", {"metric": 0.5, "objective": 0.5, "trial": pack_record(trial)})
    journal = Journal(tmp_path / "journal.jsonl")
    recorder = TrialRecorder(tmp_path, journal, higher_is_better=True)

    class _Trial:
        trial_id = "t0"

    _Trial.config = config
    recorded = recorder.record(_Trial(), trial)
    journal.close()
    # A resumed search: both read the journal.
    resumed = SettingSearcher.strategy("TPE", [space], mode="max", seed=0)
    prior = Journal(journal.path).load()
    resumed.add_finished(prior)
    again = TrialRecorder(tmp_path, Journal(journal.path), higher_is_better=True, prior=prior)
    for records in (fresh.context.records, resumed.context.records, [recorded], again.records):
        (record,) = records
        assert type(record) is TrialRecord
        assert (record.trial_id, record.key, record.metric, record.is_candidate) == (
            "t0",
            config["key"],
            0.5,
            True,
        )
        assert record.model_size_bytes == 10
    assert again.best is prior[0]


def test_a_record_is_read_by_attribute_only():
    """One shape: a record is no mapping, so a reader cannot take it for the dict it replaced
    (``record["metric"]``, ``record.get("status")``); its fields are attributes."""
    from collections.abc import Mapping

    assert not isinstance(FULL, Mapping)
    assert not hasattr(FULL, "get") and not hasattr(FULL, "keys")
    with pytest.raises(TypeError):
        FULL["metric"]  # noqa: B018
    assert FULL.metric == 0.25 and FULL.replace(metric=0.5) != FULL
