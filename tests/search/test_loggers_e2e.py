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


def _logged_search(
    mlp_files: dict[str, Path], folder: Path, tracking: str, seed: int, **overrides: Any
) -> dict[str, Any]:
    """A TPE search of :data:`PERCENTILES` logged to MLflow (``tracking``, experiment
    ``quant``) and W&B offline, one trial at a time, output in ``folder``."""
    return {
        "model": str(mlp_files["model"]),
        "calibration_data": str(mlp_files["data"]),
        "search_space": PERCENTILES,
        "search_algo": "TPE",
        "metric": "L2",
        "tolerance": 0.05,
        "seed": seed,
        "stop": {"iteration_limit": 2},
        "resources": {"max_concurrent_trials": 1},
        "loggers": {
            "mlflow": {"tracking_uri": tracking, "experiment_name": "quant"},
            "wandb": {"project": "quant", "mode": "offline"},
        },
        "output_dir": str(folder),
        **overrides,
    }


def _described(result: Any) -> dict[str, Any]:
    folder = result.output_dir
    return {
        "folder": folder,
        "rows": result.results.to_pylist(),
        "search_id": search_id(folder),
        "name": default_study_name(folder, search_id(folder)),
        "best": result.summary["best_trial_id"],
    }


@pytest.fixture(scope="module")
def three_sessions(mlp_files, tmp_path_factory) -> dict[str, Any]:
    """Three search sessions in a row into one MLflow experiment (SQLite), one trial at a
    time: search A (two trials, W&B offline too, with a user's Tune callbacks: one that fails
    to set up, one that sees every event), search B (one trial, MLflow only: the experiment
    holds two searches to tell apart), then A resumed to three trials (W&B too: the first
    session's runs must not be logged again). Each search's folder and results as they ended,
    A's first session's rows, and the callbacks (each session on Ray costs seconds, and each
    W&B run a logging actor: one set of sessions serves every test here)."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("loggers")
    tracking = f"sqlite:///{folder / 'mlflow.db'}"
    # Its artifacts in the test's folder (MLflow's default is ./mlruns of the working folder).
    MlflowClient(tracking).create_experiment("quant", (folder / "artifacts").as_uri())
    seen, unreachable = Seen(), Unreachable()
    config_a = _logged_search(mlp_files, folder / "a", tracking, seed=0)
    first = AutoSearch(config_a).run(callbacks=[unreachable, seen])
    first_rows = first.results.to_pylist()
    mlflow_only = {"mlflow": {"tracking_uri": tracking, "experiment_name": "quant"}}
    config_b = _logged_search(
        mlp_files, folder / "b", tracking, seed=1, loggers=mlflow_only, stop={"iteration_limit": 1}
    )
    b = AutoSearch(config_b).run()
    resumed = AutoSearch.resume(
        first.output_dir, config={**config_a, "stop": {"iteration_limit": 3}}
    )
    return {
        "tracking_uri": tracking,
        "first_rows": first_rows,
        "searches": [_described(resumed), _described(b)],
        "callbacks": (seen, unreachable),
    }


def test_a_users_tune_callback_sees_every_trials_result(three_sessions):
    # Search A's first session, run with a user's callbacks beside Ray's loggers.
    seen, unreachable = three_sessions["callbacks"]
    first = three_sessions["searches"][0]
    # A callback that fails to set up is dropped with a warning; the search goes on.
    assert not unreachable.results and not unreachable.completed
    log = (first["folder"] / "auto_search.log").read_text()
    assert "Unreachable failed to set up (ConnectionError" in log
    table = three_sessions["first_rows"]
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
    ``<output_dir>/ray_results/search/<trial>/wandb/offline-run-*/run-<trial id>.wandb``, a
    resumed session's trials under its own experiment folder (``search-2/``, ...)."""
    results = output_dir / "ray_results"
    found = [
        *results.glob("search/*/wandb/offline-run-*/run-*.wandb"),
        *results.glob("search-*/*/wandb/offline-run-*/run-*.wandb"),
    ]
    return {p.stem.removeprefix("run-"): p for p in sorted(found)}


def used_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The settings a trial ran, as its run's ``settings/<key>`` (nested keys by ``/``)."""
    return {
        "settings/" + k[len("params/") :].replace(".", "/"): v
        for k, v in row.items()
        if k.startswith("params/") and v is not None
    }


def test_wandb_sessions_in_a_row_leave_every_trials_offline_run_complete(three_sessions):
    # A's two sessions (the second a resume, after B's) each logged their own trials.
    a, b = three_sessions["searches"]
    assert not offline_runs(b["folder"])  # B logged to MLflow only
    runs = offline_runs(a["folder"])
    assert len(a["rows"]) == 3 and set(runs) == {r["trial_id"] for r in a["rows"]}
    for row in a["rows"]:
        run = read_run(runs[row["trial_id"]])
        # Ended (W&B's exit record), with the trial's final result logged.
        assert run["exit"] == 0, row["trial_id"]
        logged = [json.loads(step["metric"]) for step in run["history"] if "metric" in step]
        assert logged and logged[-1] == pytest.approx(row["metric"])


def test_wandb_runs_hold_each_setting_once_the_documented_numbers_and_the_trials_words(
    three_sessions,
):
    for search in three_sessions["searches"][:1]:  # B logged to MLflow only
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


def test_mlflow_holds_one_run_per_trial_and_a_resumed_search_adds_only_new_ones(
    three_sessions,
):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(three_sessions["tracking_uri"])
    experiment = client.get_experiment_by_name("quant").experiment_id
    a, b = three_sessions["searches"]
    first = {r["trial_id"] for r in three_sessions["first_rows"]}
    assert len(first) == 2 and first < {r["trial_id"] for r in a["rows"]}
    # A's three trials (two, then one more resumed) and B's one: the two of A's first session
    # were not logged again by its resumed session.
    runs = client.search_runs([experiment])
    assert len(runs) == len(a["rows"]) + len(b["rows"]) == 3 + 1
    assert sorted(r.data.tags["trial_id"] for r in runs) == sorted(
        r["trial_id"] for r in a["rows"] + b["rows"]
    )


def test_mlflow_runs_hold_each_setting_once_the_documented_numbers_and_the_searchs_id(
    three_sessions,
):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(three_sessions["tracking_uri"])
    experiment = client.get_experiment_by_name("quant").experiment_id
    for search in three_sessions["searches"]:
        # Two searches in one experiment, told apart by the search's id.
        runs = client.search_runs(
            [experiment], filter_string=f"tags.search_id = '{search['search_id']}'"
        )
        by_trial = {r.data.tags["trial_id"]: r for r in runs}
        assert len(runs) == len(by_trial) == len(search["rows"])
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
            assert run.data.metrics["is_candidate"] == float(row["is_candidate"])
            assert {"model_size_bytes", "latency_ms"} <= set(run.data.metrics)
            history = client.get_metric_history(run.info.run_id, "metric")
            assert [m.value for m in history] == pytest.approx([row["metric"]])
        # The best model's files are the artifacts of the search's best trial's run.
        best = by_trial[search["best"]]
        listed = {a.path for a in client.list_artifacts(best.info.run_id, "best_model")}
        assert "best_model/model.onnx" in listed
