"""The recorder keeps the model of the trial the outputs will call the best: trials that run
two at a time end out of the order they started, and on a tie (QUInt8 and QInt8 activations
give the same metric on many models) the outputs take the trial started first."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from raysearch.outputs import best_record
from raysearch.search.journal import Journal
from raysearch.search.recorder import TrialRecorder
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
        record = {"status": "ok", "metric": 0.99, "is_candidate": False, "model_path": str(path)}
        recorder.record(_trial(trial_id, number), record)
    best = best_record(recorder.records, higher_is_better=True)
    assert best is not None and best["trial_id"] == "first"
    assert best["model_file"] == "kept/first.onnx" and (out / best["model_file"]).is_file()
    assert recorder.best is not None and recorder.best["trial_id"] == "first"
    # The other's model is gone: one kept model, the best one.
    assert sorted(p.name for p in (out / "kept").iterdir()) == ["first.onnx"]
    assert not list(trials.iterdir())
