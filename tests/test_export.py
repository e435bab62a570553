"""``raysearch export DIR --optuna URL``: a search written as an Optuna study that
``optuna.load_study`` (and so optuna-dashboard) opens, every trial checked against
``results.parquet``; and its refusals (one line, exit 2): a folder that is no search, a storage
Optuna cannot open, a study of that name already there (``--overwrite`` replaces that one only).
"""

from __future__ import annotations

import json
import math

import numpy as np
import optuna
import pyarrow.parquet as pq
import pytest
import yaml
from optuna.trial import TrialState

from raysearch.cli import main
from raysearch.trialrecord import TrialRecord
from tests.models import make_mlp_model, mlp_data
from tests.test_outputs import config  # noqa: F401  (a fixture)
from tests.test_report import _records


def _storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def _folder(out, config) -> None:  # noqa: F811
    """A search folder of the unit records (two complete trials, one failed), no Ray."""
    out.mkdir()
    (out / "raysearch_config.yaml").write_text(yaml.safe_dump(config.raw))
    (out / ".raysearch.json").write_text(json.dumps({"status": "running"}))
    (out / "journal.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in _records()))


def test_export_refuses_with_one_line_and_exit_2(config, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    _folder(out, config)
    storage = _storage(tmp_path)

    def refused(*argv: str) -> str:
        assert main(["export", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    assert "no raysearch search here" in refused(str(tmp_path / "nothing"), "--optuna", storage)
    assert "Optuna cannot open this storage" in refused(str(out), "--optuna", "nosuch://x")
    missing_dir = f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}"
    assert "Optuna cannot open this storage" in refused(str(out), "--optuna", missing_dir)
    # Another study of the user's in the same storage stays whatever happens.
    optuna.create_study(storage=storage, study_name="theirs")
    assert main(["export", str(out), "--optuna", storage, "--study-name", "mine"]) == 0
    assert "Optuna study 'mine'" in capsys.readouterr().out
    assert "'mine' is there already" in refused(
        str(out), "--optuna", storage, "--study-name", "mine"
    )
    argv = ["export", str(out), "--optuna", storage, "--study-name", "mine", "--overwrite"]
    assert main(argv) == 0
    assert sorted(optuna.get_all_study_names(storage)) == ["mine", "theirs"]
    study = optuna.load_study(study_name="mine", storage=storage)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
    assert "Segmentation fault" in study.trials[2].user_attrs["error"]
    # The default name: the folder's.
    assert main(["export", str(out), "--optuna", storage]) == 0
    assert "out" in optuna.get_all_study_names(storage)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_real_search_exported_is_every_trial_of_its_results(tmp_path, capsys):
    from raysearch.search import AutoSearch
    from tests.test_report_browser import ROWS, _rung_config

    # The report tests' search: rungs of 40, 132 and 400 rows, so stopped trials (PRUNED)
    # and intermediate values.
    np.savez(tmp_path / "calib.npz", **mlp_data(64))
    np.savez(tmp_path / "eval.npz", **mlp_data(ROWS, seed=5))
    files = {"model": make_mlp_model(tmp_path / "mlp.onnx"), "folder": tmp_path}
    settings = _rung_config(files, tmp_path / "search")
    out = AutoSearch(settings).run().output_dir
    storage = _storage(tmp_path)
    assert main(["export", str(out), "--optuna", storage, "--study-name", "s"]) == 0
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    rows = pq.read_table(out / "results.parquet").to_pylist()
    journal = {
        r["trial_id"]: r
        for r in map(json.loads, (out / "journal.jsonl").read_text().splitlines())
        if "trial_id" in r
    }
    assert len(study.trials) == len(rows) == 8
    states = set()
    for trial, row in zip(study.trials, rows):
        assert trial.user_attrs["trial_id"] == row["trial_id"]
        params = {k[len("params/") :]: v for k, v in row.items() if k.startswith("params/")}
        assert trial.params == {k: v for k, v in params.items() if v is not None}
        stopped = row["stopped_at_rung"] is not None
        if row["status"] != "ok":
            state, value = TrialState.FAIL, None
        elif stopped:
            state, value = TrialState.PRUNED, None
        else:
            state, value = TrialState.COMPLETE, row["metric"]
        states.add(state)
        assert trial.state == state and trial.value == value, (trial, row)
        assert trial.user_attrs["is_candidate"] == bool(row["is_candidate"])
        assert trial.user_attrs["stage"] == row.get("stage")
        assert trial.user_attrs["model_size_bytes"] == row["model_size_bytes"]
        assert trial.user_attrs["latency_ms"] == row["latency_ms"]
        assert trial.user_attrs["error"] == row["error"]
        # The metric at each rung the trial reached (the journal's rung_metrics), the last
        # the trial's metric; where ASHA ranked the trial (no protected mark), its score (L2:
        # lower is better, kept negated).
        record = journal[row["trial_id"]]
        expected = dict(enumerate(record.get("rung_metrics") or []))
        if row["metric"] is not None and (record.get("rungs") or 1) > 1:
            assert expected[record.get("rung") or 0] == row["metric"]
        for i, score in enumerate(record.get("rung_scores") or []):
            if math.isfinite(score) and score < 1e299:
                assert expected[i] == pytest.approx(-score)
        assert trial.intermediate_values == pytest.approx(expected)
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states
    assert any(t.intermediate_values for t in study.trials)


def _front_records() -> list[TrialRecord]:
    """Five trials of a search over L2 (lower is better) and the model's size: three
    candidates, one of them dominated, and a non-candidate smaller than any (on Optuna's own
    Pareto front were it feasible), and a failed trial."""
    rows = [
        ("a", 0.010, 4_000_000, True),
        ("b", 0.020, 2_000_000, True),
        ("c", 0.030, 3_000_000, True),  # dominated by b
        ("d", 0.500, 1_000_000, False),  # the smallest, but beyond the tolerance
    ]
    records = [
        TrialRecord(
            trial_id=t,
            number=i,
            status="ok",
            metric=m,
            model_size_bytes=s,
            is_candidate=c,
            params={"per_channel": i % 2 == 0},
            started_at=1000.0 + i,
            ended_at=1001.0 + i,
        )
        for i, (t, m, s, c) in enumerate(rows)
    ]
    records.append(TrialRecord(trial_id="e", number=4, status="failed"))
    return records


def test_a_multi_objective_search_is_a_multi_objective_study_live_and_exported(tmp_path):
    from raysearch.outputs import LiveStudy, export_study
    from raysearch.ranking import pareto_front

    records = _front_records()
    objectives = ["metric", "model_size_mb"]
    summary = {"metric": "L2", "higher_is_better": False, "objectives": objectives}
    front = [r.trial_id for r in pareto_front(records, objectives, False)]
    assert front == ["a", "b"]
    exported = export_study(records, summary, _storage(tmp_path), "exported")
    live = LiveStudy(_storage(tmp_path), "live", summary)
    live.open()
    for record in records:  # as each trial ends
        live.add(record)
    for name in ("exported", "live"):
        study = optuna.load_study(study_name=name, storage=_storage(tmp_path))
        assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2, name
        assert study.metric_names == ["L2", "model_size_mb"]
        assert sorted(t.user_attrs["trial_id"] for t in study.best_trials) == front, name
        by_id = {t.user_attrs["trial_id"]: t for t in study.trials}
        assert by_id["b"].values == [0.02, 2.0]
        assert by_id["e"].state == TrialState.FAIL
    assert (
        exported.best_trials
        == optuna.load_study(study_name="exported", storage=_storage(tmp_path)).best_trials
    )


def test_a_multi_objective_export_ranks_latency_as_timed_alone_after_the_search(tmp_path):
    from raysearch.outputs import export_study

    records = [
        r.replace(latency_ms=5.0, model_size_bytes=1_000_000) for r in _front_records() if r.ok
    ]
    objectives = ["metric", "latency_ms"]
    # In the search "a" looked as fast as "b"; timed alone, "b" is faster.
    summary = {
        "metric": "L2",
        "higher_is_better": False,
        "objectives": objectives,
        "latency_retimed": {"models": {"a": {"median_ms": 6.0}, "b": {"median_ms": 3.0}}},
    }
    study = export_study(records, summary, _storage(tmp_path), "s")
    assert sorted(t.user_attrs["trial_id"] for t in study.best_trials) == ["a", "b"]
    by_id = {t.user_attrs["trial_id"]: t for t in study.trials}
    assert by_id["a"].values == [0.01, 6.0] and by_id["c"].values == [0.03, 5.0]
