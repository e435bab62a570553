"""Ray Tune callbacks and Ray's own experiment loggers (MLflow, W&B) on a real search: real
local Ray, real ONNX Runtime, the real MLflow and W&B libraries (local stores, no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ray import tune

from raysearch.errors import ConfigError, InputError
from raysearch.outputs import default_study_name
from raysearch.search import AutoSearch
from raysearch.search.record.output_dir import search_id
from tests.search.wandb_runs import read_run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

FOUR = {"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True, False]}
#: One trial at a time where trials side by side are not what a test checks: one trial actor
#: (a Ray worker process, several CPU-seconds to start) per search instead of two.
ONE_AT_A_TIME = {"max_concurrent_trials": 1}


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
    config = make_config(
        search_space=FOUR, loggers=loggers, stop={"iteration_limit": 2}, resources=ONE_AT_A_TIME
    )
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
    by_trial = {r.data.tags["trial_id"]: r for r in found}
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


def test_a_logger_setting_typo_is_refused_with_a_hint(make_config):
    with pytest.raises(
        ConfigError, match=r"loggers.mlflow.tracking_url.*did you mean 'tracking_uri'"
    ):
        AutoSearch(make_config(loggers={"mlflow": {"tracking_url": "file:///x"}}))


#: A space whose sampler proposes a percentile with MinMax too, where it means nothing.
PERCENTILES = {
    "calibrate_method": ["MinMax", "Percentile"],
    "extra_options": {"CalibPercentile": [99.9, 99.99]},
}
#: Every number a trial's run gets: the metric and the record's documented extras.
NUMBERS = {
    "metric",
    "objectives/metric",
    "is_candidate",
    "model_size_bytes",
    "latency_ms",
    "duration_s",
    "calibration_s",
    "quantization_s",
    "evaluation_s",
    "eval_rows",
    "eval_fraction",
    "rung",
    "rungs",
}


@pytest.fixture(scope="module")
def three_searches(mlp_files, tmp_path_factory) -> dict[str, Any]:
    """Three searches in a row (TPE, two trials each, one at a time) into one MLflow
    experiment (SQLite) and W&B offline, the first with a user's Tune callbacks too (one that
    fails to set up, one that sees every event): each search's folder and results, and the
    callbacks (each search on Ray costs seconds; one serves the callbacks' test too)."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("loggers")
    tracking = f"sqlite:///{folder / 'mlflow.db'}"
    # Its artifacts in the test's folder (MLflow's default is ./mlruns of the working folder).
    MlflowClient(tracking).create_experiment("quant", (folder / "artifacts").as_uri())
    searches = []
    seen, unreachable = Seen(), Unreachable()
    for n in range(3):
        config = {
            "model": str(mlp_files["model"]),
            "calibration_data": str(mlp_files["data"]),
            "search_space": PERCENTILES,
            "search_algo": "TPE",
            "metric": "L2",
            "tolerance": 0.05,
            "seed": n,
            "stop": {"iteration_limit": 2},
            "resources": {"max_concurrent_trials": 1},
            "loggers": {
                "mlflow": {"tracking_uri": tracking, "experiment_name": "quant"},
                "wandb": {"project": "quant", "mode": "offline"},
            },
            "output_dir": str(folder / f"out{n}"),
        }
        result = AutoSearch(config).run(callbacks=[unreachable, seen] if n == 0 else None)
        searches.append(
            {
                "folder": result.output_dir,
                "rows": result.results.to_pylist(),
                "search_id": search_id(result.output_dir),
                "name": default_study_name(result.output_dir, search_id(result.output_dir)),
                "best": result.summary["best_trial_id"],
            }
        )
    return {"tracking_uri": tracking, "searches": searches, "callbacks": (seen, unreachable)}


def test_a_users_tune_callback_sees_every_trials_result(three_searches):
    # The first of the three searches, run with a user's callbacks beside Ray's loggers.
    seen, unreachable = three_searches["callbacks"]
    first = three_searches["searches"][0]
    # A callback that fails to set up is dropped with a warning; the search goes on.
    assert not unreachable.results and not unreachable.completed
    log = (first["folder"] / "auto_search.log").read_text()
    assert "Unreachable failed to set up (ConnectionError" in log
    table = first["rows"]
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


def offline_runs(output_dir: Path) -> dict[str, Path]:
    """Each trial's offline W&B run file where the README says runs go:
    ``<output_dir>/ray_results/search/<trial>/wandb/offline-run-*/run-<trial id>.wandb``."""
    found = (output_dir / "ray_results" / "search").glob("*/wandb/offline-run-*/run-*.wandb")
    return {p.stem.removeprefix("run-"): p for p in sorted(found)}


def used_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The settings a trial ran, as its run's ``settings/<key>`` (nested keys by ``/``)."""
    return {
        "settings/" + k[len("params/") :].replace(".", "/"): v
        for k, v in row.items()
        if k.startswith("params/") and v is not None
    }


def test_three_wandb_searches_in_a_row_leave_every_trials_offline_run_complete(three_searches):
    for search in three_searches["searches"]:
        runs = offline_runs(search["folder"])
        assert set(runs) == {r["trial_id"] for r in search["rows"]}, search["folder"]
        for row in search["rows"]:
            run = read_run(runs[row["trial_id"]])
            # Ended (W&B's exit record), with the trial's final result logged.
            assert run["exit"] == 0, (search["folder"], row["trial_id"])
            logged = [json.loads(step["metric"]) for step in run["history"] if "metric" in step]
            assert logged and logged[-1] == pytest.approx(row["metric"])


def test_wandb_runs_hold_each_setting_once_the_documented_numbers_and_the_trials_words(
    three_searches,
):
    for search in three_searches["searches"]:
        runs = offline_runs(search["folder"])
        for row in search["rows"]:
            run = read_run(runs[row["trial_id"]])
            assert run["name"] == f"{search['name']} trial {row['number']}"
            assert run["tags"] == [search["search_id"]]
            assert run["group"] == search["name"]
            config = {k: json.loads(v) for k, v in run["config"].items() if k != "_wandb"}
            # Each setting once, as the trial ran it (no percentile on a MinMax trial).
            expected: dict[str, Any] = {"calibrate_method": row["params/calibrate_method"]}
            percentile = row["params/extra_options.CalibPercentile"]
            if percentile is not None:
                expected["extra_options"] = {"CalibPercentile": percentile}
            assert config.pop("settings") == expected
            # The trial's words; Ray's own keys (the trial's folder, host, pid) as it puts them.
            assert config["trial_id"] == row["trial_id"]
            assert config["trial_number"] == str(row["number"])
            assert config["status"] == "ok" and "stage" not in config  # TPE has no stages
            assert not {"point", "params", "key", "phase"} & set(config)
            for step in run["history"]:
                numbers = {k for k in step if not k.startswith("_")} - {"training_iteration"}
                assert numbers <= NUMBERS and "metric" in numbers, numbers
                assert all(abs(json.loads(step[k])) < 1e299 for k in numbers)


def test_mlflow_runs_hold_each_setting_once_the_documented_numbers_and_the_searchs_id(
    three_searches,
):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(three_searches["tracking_uri"])
    experiment = client.get_experiment_by_name("quant").experiment_id
    for search in three_searches["searches"]:
        # Three searches in one experiment, told apart by the search's id.
        runs = client.search_runs(
            [experiment], filter_string=f"tags.search_id = '{search['search_id']}'"
        )
        by_trial = {r.data.tags["trial_id"]: r for r in runs}
        assert set(by_trial) == {r["trial_id"] for r in search["rows"]}
        for row in search["rows"]:
            run = by_trial[row["trial_id"]]
            assert run.info.run_name == f"{search['name']} trial {row['number']}"
            assert run.info.status == "FINISHED"
            assert run.data.params == {k: str(v) for k, v in used_settings(row).items()}
            tags = run.data.tags
            assert tags["search"] == search["name"]
            assert tags["trial_number"] == str(row["number"]) and tags["status"] == "ok"
            assert "stage" not in tags  # TPE has no stages
            assert set(run.data.metrics) <= NUMBERS and "metric" in run.data.metrics
            assert run.data.metrics["metric"] == pytest.approx(row["metric"])
            history = client.get_metric_history(run.info.run_id, "metric")
            assert [m.value for m in history] == pytest.approx([row["metric"]])
        # The best model's files are the artifacts of the search's best trial's run.
        best = by_trial[search["best"]]
        listed = {a.path for a in client.list_artifacts(best.info.run_id, "best_model")}
        assert "best_model/model.onnx" in listed
