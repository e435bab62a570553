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


def test_loggers_are_named_with_their_settings_or_as_a_list():
    assert config(loggers=["mlflow", "W&B"]).loggers == (("mlflow", {}), ("wandb", {}))
    given = config(loggers={"mlflow": {"tracking_uri": "sqlite:///m.db"}, "wandb": None})
    assert given.loggers == (("mlflow", {"tracking_uri": "sqlite:///m.db"}), ("wandb", {}))


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
