"""The recorder keeps the model of the trial the outputs will call the best: trials that run
two at a time end out of the order they started, and on a tie (QUInt8 and QInt8 activations
give the same metric on many models) the outputs take the trial started first."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from raysearch.outputs import best_record, results_table
from raysearch.search.record.journal import Journal
from raysearch.search.record.recorder import TrialRecorder
from raysearch.trialrecord import TrialRecord
from tests.models import make_mlp_model


def _trial(trial_id: str, number: int) -> SimpleNamespace:
    """What the recorder reads of a Tune trial: its id and its config."""
    params = {"activation_type": "QUInt8" if number == 1 else "QInt8"}
    return SimpleNamespace(trial_id=trial_id, config={"number": number, "params": params})


def test_on_a_tie_the_model_kept_is_the_best_records_whichever_ends_first(tmp_path: Path):
    model = make_mlp_model(tmp_path / "float.onnx")
    out = tmp_path / "out"
    trials = out / "trials_tmp"
    trials.mkdir(parents=True)
    recorder = TrialRecorder(out, Journal(out / "journal.jsonl"), higher_is_better=True)
    # Trial #2 ends first, then #1 with the same metric.
    for trial_id, number in (("second", 2), ("first", 1)):
        path = trials / f"{trial_id}.onnx"
        shutil.copy(model, path)
        record = TrialRecord(status="ok", metric=0.99, model_path=str(path))
        recorder.record(_trial(trial_id, number), record)
    best = best_record(recorder.records, higher_is_better=True)
    assert best is not None and best.trial_id == "first"
    assert best.model_file == "kept/first.onnx" and (out / best.model_file).is_file()
    assert recorder.best is not None and recorder.best.trial_id == "first"
    # The other's model is gone: one kept model, the best one.
    assert sorted(p.name for p in (out / "kept").iterdir()) == ["first.onnx"]
    assert not list(trials.iterdir())


def test_with_the_search_clock_the_best_trials_model_stays_kept(tmp_path: Path):
    """The record the recorder keeps as its best is the one in its records (the search's
    clock adds ``elapsed_s`` to every record): the best model is never deleted as unkept."""
    model = make_mlp_model(tmp_path / "float.onnx")
    out = tmp_path / "out"
    recorder = TrialRecorder(
        out, Journal(out / "journal.jsonl"), higher_is_better=True, clock=lambda: 1.5
    )
    for trial_id, number, metric in (("t1", 1, 0.9), ("t2", 2, 0.95)):
        path = out / "trials_tmp" / f"{trial_id}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(model, path)
        record = TrialRecord(status="ok", metric=metric, model_path=str(path))
        recorder.record(_trial(trial_id, number), record)
    assert recorder.best is recorder.records[-1] and recorder.best.elapsed_s == 1.5
    assert _files(out / "kept") == ["t2"]
    assert _model_files(recorder.records) == {"t1": None, "t2": "kept/t2.onnx"}
    recorder.journal.close()


def _candidate(recorder: TrialRecorder, model: Path, trial_id: str, number: int, metric: float):
    """A candidate trial ending with ``metric`` (higher is better), its model in trials_tmp/."""
    path = recorder.output_dir / "trials_tmp" / f"{trial_id}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, path)
    record = TrialRecord(status="ok", metric=metric, is_candidate=True, model_path=str(path))
    return recorder.record(_trial(trial_id, number), record)


def _files(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.onnx")) if folder.is_dir() else []


def _model_files(records: list[TrialRecord]) -> dict[str, str | None]:
    return {r.trial_id: r.model_file for r in records}


def test_keep_candidates_keeps_the_best_models_and_a_resumed_recorder_the_same(tmp_path: Path):
    model = make_mlp_model(tmp_path / "float.onnx")
    out = tmp_path / "out"
    journal = Journal(out / "journal.jsonl")
    recorder = TrialRecorder(out, journal, higher_is_better=True, keep_candidates=2)
    for number, (trial_id, metric) in enumerate(
        [("t1", 0.95), ("t2", 0.99), ("t3", 0.97), ("t4", 0.90)], start=1
    ):
        _candidate(recorder, model, trial_id, number, metric)
    # t3 pushed t1 out of the two best; t4 was never among them.
    assert _files(out / "candidates") == ["t2", "t3"]
    assert _model_files(recorder.records) == {
        "t1": None,
        "t2": "candidates/t2.onnx",
        "t3": "candidates/t3.onnx",
        "t4": None,
    }
    assert recorder.best is not None and recorder.best.trial_id == "t2"
    assert not (out / "kept").exists() and not list((out / "trials_tmp").iterdir())
    # Every candidate stays in the journal, with its settings and metric.
    journal.close()
    prior = Journal(out / "journal.jsonl").load()
    assert [(r.trial_id, r.metric, r.params) for r in prior] == [
        (r.trial_id, r.metric, r.params) for r in recorder.records
    ]

    # A session killed after t3's journal line, before t1's model was deleted, left it there:
    # the resumed search deletes it and keeps the same two, never bringing t1's back.
    shutil.copy(model, out / "candidates" / "t1.onnx")
    resumed = TrialRecorder(
        out, Journal(out / "journal.jsonl"), higher_is_better=True, keep_candidates=2, prior=prior
    )
    assert _files(out / "candidates") == ["t2", "t3"]
    assert _model_files(resumed.records) == _model_files(recorder.records)
    assert resumed.best is not None and resumed.best.trial_id == "t2"
    # A better candidate after the resume pushes out the worst kept one, not the best.
    _candidate(resumed, model, "t5", 5, 0.995)
    assert _files(out / "candidates") == ["t2", "t5"]
    table = results_table(resumed.records).to_pylist()
    assert {r["trial_id"]: r["model_file"] for r in table} == {
        "t1": None,
        "t2": "candidates/t2.onnx",
        "t3": None,
        "t4": None,
        "t5": "candidates/t5.onnx",
    }
    assert all(r["is_candidate"] and r["metric"] is not None for r in table)
    resumed.journal.close()


def test_keep_candidates_0_keeps_only_the_best_model_in_kept(tmp_path: Path):
    model = make_mlp_model(tmp_path / "float.onnx")
    out = tmp_path / "out"
    recorder = TrialRecorder(
        out, Journal(out / "journal.jsonl"), higher_is_better=False, keep_candidates=0
    )
    for number, (trial_id, metric) in enumerate([("t1", 0.3), ("t2", 0.1), ("t3", 0.2)], 1):
        _candidate(recorder, model, trial_id, number, metric)
    assert not (out / "candidates").exists()
    assert _files(out / "kept") == ["t2"]
    assert _model_files(recorder.records) == {"t1": None, "t2": "kept/t2.onnx", "t3": None}
    recorder.journal.close()
