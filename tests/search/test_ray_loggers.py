"""What raysearch's MLflow logger (``raysearch/search/tune/_ray_loggers.py``) writes of one
trial, called as Tune calls it, with Ray Tune's own ``Trial`` and a real MLflow tracking
store (SQLite): a staged strategy's stage and a failed trial's status and error as tags, each
setting once, the documented numbers only."""

from __future__ import annotations

from ray.tune.experiment import Trial

from raysearch.search.tune._ray_loggers import LOGGED_NUMBERS, make_loggers


def test_a_failed_trial_of_a_stage_is_one_run_with_its_words_as_tags(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("q", (tmp_path / "artifacts").as_uri())
    config = {
        "number": 3,
        "phase": 1,
        "stage": "calibration",
        "point": {"calibrate_method": "MinMax", "extra_options.CalibPercentile": 99.9},
        "params": {"calibrate_method": "MinMax"},
        "settings": {"calibrate_method": "MinMax", "extra_options": {"ActivationSymmetric": True}},
        "key": '{"calibrate_method": "MinMax"}',
    }
    trial = Trial("QuantTrainable", config=config, stub=True, trial_id="abc123")
    settings = {"tracking_uri": uri, "experiment_name": "q"}
    [logger] = make_loggers([("mlflow", settings)], "s1", "out")
    logger.setup()
    logger.log_trial_start(trial)
    result = {
        "metric": 0.5,
        "objective": 8.5,  # the sampler's: never logged
        "rung_score": 1e300,  # ASHA's mark: never logged
        "rung_clock": 1.0,
        "config": config,  # Tune's copy of the trial's config: never logged
        "time_total_s": 2.0,
        "status": "failed",
        "error": "ONNX Runtime refused the model",
        "stage": "calibration",
        "training_iteration": 1,
    }
    logger.log_trial_result(1, trial, result)
    logger.log_trial_end(trial, failed=True)

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("q").experiment_id])
    assert run.info.run_name == "out trial 3" and run.info.status == "FAILED"
    assert {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")} == {
        "search_id": "s1",
        "search": "out",
        "trial_id": "abc123",
        "trial_number": "3",
        "stage": "calibration",
        "status": "failed",
        "error": "ONNX Runtime refused the model",
    }
    assert run.data.params == {
        "settings/calibrate_method": "MinMax",
        "settings/extra_options/ActivationSymmetric": "True",
    }
    assert run.data.metrics == {"metric": 0.5}
    assert set(run.data.metrics) <= set(LOGGED_NUMBERS)
