"""Ray Tune callbacks and Ray's own experiment loggers (MLflow, W&B) on a real search: real
local Ray, real ONNX Runtime, the real MLflow and W&B libraries (local stores, no server)."""

from __future__ import annotations

import pytest
from ray import tune

from raysearch.errors import ConfigError, InputError
from raysearch.search import AutoSearch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

FOUR = {"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True, False]}


class Seen(tune.Callback):
    """A user's callback: every result and every trial that ended."""

    def __init__(self) -> None:
        self.results: list[dict] = []
        self.completed: list[str] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.results.append(dict(result))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed.append(trial.trial_id)


class Unreachable(Seen):
    """A callback whose setup fails (say, its tracking server is out of reach)."""

    def setup(self, **info):
        raise ConnectionError("tracking server out of reach")


def test_a_users_tune_callback_sees_every_trials_result(make_config):
    seen, unreachable = Seen(), Unreachable()
    result = AutoSearch(make_config(search_space=FOUR)).run(callbacks=[unreachable, seen])
    # A callback that fails to set up is dropped with a warning; the search goes on.
    assert not unreachable.results and not unreachable.completed
    log = (result.output_dir / "auto_search.log").read_text()
    assert "Unreachable failed to set up (ConnectionError" in log
    table = result.results.to_pylist()
    assert sorted(seen.completed) == sorted(r["trial_id"] for r in table)
    final = {r["trial_id"]: r for r in seen.results if r.get("done")}
    assert set(final) == {r["trial_id"] for r in table}
    for row in table:
        logged = final[row["trial_id"]]
        # The record as numbers and words, not the JSON text Tune carries.
        assert "trial" not in logged
        assert logged["metric"] == pytest.approx(row["metric"])
        assert logged["is_candidate"] == row["is_candidate"]
        assert logged["model_size_bytes"] == row["model_size_bytes"]
        assert logged["objectives/metric"] == pytest.approx(row["metric"])
        assert logged["status"] == "ok"


def test_a_callback_that_is_not_a_tune_callback_is_refused_before_anything_runs(
    make_config, tmp_path
):
    with pytest.raises(InputError, match=r"callbacks\[0\]: expected a ray.tune.Callback"):
        AutoSearch(make_config(search_space=FOUR)).run(callbacks=[print])
    assert not (tmp_path / "out").exists()


def test_mlflow_holds_one_run_per_trial_and_a_resumed_search_adds_only_new_ones(
    make_config, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    # MLflow 3 keeps its local file store behind this switch (a database is its default).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    loggers = {"mlflow": {"tracking_uri": uri, "experiment_name": "quant"}}
    config = make_config(search_space=FOUR, loggers=loggers, stop={"iteration_limit": 2})
    first = AutoSearch(config).run()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("quant").experiment_id

    assert len(client.search_runs([experiment])) == first.summary["n_trials"] == 2
    resumed = AutoSearch.resume(first.output_dir, config={**config, "stop": {"iteration_limit": 4}})
    table = resumed.results.to_pylist()
    assert len(table) == 4
    found = client.search_runs([experiment])
    # One run per trial: the two of the first session were not logged again.
    assert len(found) == 4
    names = sorted(r.data.tags["trial_name"] for r in found)
    assert len(set(names)) == 4
    by_trial = {
        next(
            row["trial_id"] for row in table if r.data.tags["trial_name"].endswith(row["trial_id"])
        ): r
        for r in found
    }
    assert set(by_trial) == {row["trial_id"] for row in table}
    for row in table:
        run = by_trial[row["trial_id"]]
        assert run.info.status == "FINISHED"
        assert run.data.params["settings/calibrate_method"] == row["params/calibrate_method"]
        assert run.data.params["settings/per_channel"] == str(row["params/per_channel"])
        assert run.data.metrics["metric"] == pytest.approx(row["metric"])
        assert run.data.metrics["is_candidate"] == float(row["is_candidate"])
        assert "model_size_bytes" in run.data.metrics and "latency_ms" in run.data.metrics
    # The best model's files are the best trial's artifacts.
    best = by_trial[resumed.summary["best_trial_id"]]
    listed = {a.path for a in client.list_artifacts(best.info.run_id, "best_model")}
    assert "best_model/model.onnx" in listed


def test_wandb_offline_writes_one_run_per_trial(make_config, tmp_path):
    loggers = {"wandb": {"project": "quant", "mode": "offline", "dir": str(tmp_path)}}
    result = AutoSearch(make_config(search_space=FOUR, loggers=loggers)).run()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == result.summary["n_trials"] == 4
    ids = {r["trial_id"] for r in result.results.to_pylist()}
    # Each run is named by its trial (W&B's run id is Tune's trial id).
    assert {run.name.rsplit("-", 1)[-1] for run in runs} == ids
    assert all(list(run.glob("run-*.wandb")) for run in runs)


def test_a_logger_setting_typo_is_refused_with_a_hint(make_config):
    with pytest.raises(
        ConfigError, match=r"loggers.mlflow.tracking_url.*did you mean 'tracking_uri'"
    ):
        AutoSearch(make_config(loggers={"mlflow": {"tracking_url": "file:///x"}}))
