"""The ``loggers`` key: Ray's logger callbacks named with their settings, each checked before
anything runs."""

from __future__ import annotations

import sys

import pytest

from raysearch.config import SearchConfig
from raysearch.errors import ConfigError

BASE = {"model": "m.onnx", "calibration_data": "c.npz", "search_space": "A8W8_SEARCH"}


def config(**overrides) -> SearchConfig:
    return SearchConfig.from_dict({**BASE, **overrides}, check_paths=False)


def test_loggers_are_named_with_their_settings_or_as_a_list(monkeypatch):
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    named = ("mlflow", {"experiment_name": "raysearch"})
    assert config(loggers=["mlflow", "W&B"]).loggers == (named, ("wandb", {}))
    given = config(loggers={"mlflow": {"tracking_uri": "sqlite:///m.db"}, "wandb": None})
    uri = {"tracking_uri": "sqlite:///m.db", "experiment_name": "raysearch"}
    assert given.loggers == (("mlflow", uri), ("wandb", {}))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "theirs")  # MLflow's own default, for Ray
    assert config(loggers=["mlflow"]).loggers == (("mlflow", {}),)


def test_a_missing_package_is_refused_in_one_line_naming_the_extra(monkeypatch):
    # A None entry in sys.modules is how Python marks a module as not importable.
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError) as caught:
        config(loggers={"wandb": {"mode": "offline"}})
    message = str(caught.value)
    assert message == "loggers.wandb: wandb needs the wandb package: pip install 'raysearch[wandb]'"


def test_a_setting_is_checked_against_the_callback_and_wandb_init():
    # mode and dir are wandb.init's, which Ray's callback passes its other keywords to.
    assert config(loggers={"wandb": {"mode": "offline", "dir": "/tmp"}}).loggers
    with pytest.raises(ConfigError, match=r"loggers.wandb.projet: .*did you mean 'project'"):
        config(loggers={"wandb": {"projet": "q"}})
    with pytest.raises(ConfigError, match=r"loggers\[0\]: unknown logger 'mlfow'.*'mlflow'"):
        config(loggers=["mlfow"])


def test_mlflow_named_without_an_experiment_logs_to_one(tmp_path, monkeypatch):
    # Ray's MLflowLoggerCallback logs nothing without an experiment (issue 57, item 6): a
    # search given ``loggers: [mlflow]`` warned and logged nothing.
    from mlflow.tracking import MlflowClient
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    ((name, settings),) = config(loggers={"mlflow": {"tracking_uri": uri}}).loggers
    MLflowLoggerCallback(**settings).setup()
    assert MlflowClient(uri).get_experiment_by_name("raysearch") is not None
