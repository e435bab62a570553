"""Optuna samplers of the user's: ``search_algo`` as a sampler instance, ``sampler_options``
checked against the sampler's signature and reaching the sampler the strategy builds."""

from __future__ import annotations

import optuna
import pytest

from raysearch.config import SearchConfig
from raysearch.errors import ConfigError
from raysearch.strategies import StrategyContext, get_strategy

BASE = {
    "model": "model.onnx",
    "calibration_data": "calib.npz",
    "search_space": {"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True, False]},
}


def config(**overrides) -> SearchConfig:
    return SearchConfig.from_dict({**BASE, **overrides}, check_paths=False)


def phases(cfg: SearchConfig):
    context = StrategyContext(
        cfg.search_spaces,
        seed=cfg.seed,
        max_trials=30,
        sampler=cfg.sampler,
        sampler_options=cfg.sampler_options,
    )
    return get_strategy(cfg.search_algo)(context)


def test_a_sampler_options_typo_is_refused_with_a_hint():
    with pytest.raises(ConfigError) as caught:
        config(search_algo="TPE", sampler_options={"multivariate": True, "n_startup_trails": 5})
    assert caught.value.path == "sampler_options.n_startup_trails"
    assert "did you mean 'n_startup_trials'" in str(caught.value)


def test_sampler_options_reach_the_sampler_over_the_fitted_arguments():
    cfg = config(search_algo="TPE", sampler_options={"n_startup_trials": 5, "group": True})
    (phase,) = phases(cfg)
    sampler = phase.optuna._sampler
    # Fitted to a 30-trial budget, TPE would start from 3 random trials.
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._n_startup_trials == 5 and sampler._group


def test_the_staged_strategies_keep_their_fitted_samplers():
    with pytest.raises(ConfigError, match="sampler_options: Auto is no Optuna sampler"):
        config(search_algo="Auto", search_space="A8W8_SEARCH", sampler_options={"seed": 1})


def test_a_sampler_instance_runs_as_given():
    given = optuna.samplers.TPESampler(multivariate=True, group=True, seed=3)
    cfg = config(search_algo=given, seed=0)
    assert cfg.search_algo == "TPE" and cfg.sampler is given
    (phase,) = phases(cfg)
    assert phase.optuna._sampler is given
    with pytest.raises(ConfigError, match="runs as it was built"):
        config(search_algo=given, sampler_options={"seed": 1})


def test_any_base_sampler_runs_as_the_sampler_strategy():
    given = optuna.samplers.PartialFixedSampler({}, optuna.samplers.RandomSampler(seed=1))
    cfg = config(search_algo=given)
    assert cfg.search_algo == "Sampler"
    (phase,) = phases(cfg)
    assert phase.optuna._sampler is given
    with pytest.raises(ConfigError, match="search_algo: Sampler is an Optuna sampler given"):
        config(search_algo="Sampler")


def test_a_sampler_class_or_a_ray_searcher_is_refused_saying_an_instance_works():
    # Issue 57, item 8: what was given, by name (no ``at 0x...``), and what works instead.
    from ray.tune.search.optuna import OptunaSearch

    with pytest.raises(ConfigError) as caught:
        config(search_algo=optuna.samplers.TPESampler)
    assert str(caught.value) == (
        "search_algo: got the class TPESampler; an Optuna sampler instance works: "
        "search_algo=TPESampler(...)"
    )
    with pytest.raises(ConfigError) as caught:
        config(search_algo=OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=1)))
    assert str(caught.value) == (
        "search_algo: got Ray Tune's OptunaSearch, a searcher raysearch does not take (it "
        "runs Tune's OptunaSearch itself, over its strategy's phases); an Optuna sampler "
        "instance works: search_algo=optuna.samplers.TPESampler(...), or a strategy's name"
    )
    with pytest.raises(ConfigError) as caught:
        config(search_algo=object())
    message = str(caught.value)
    assert message.startswith("search_algo: expected one of Auto, Grid, Random, TPE")
    assert message.endswith(
        "or an Optuna sampler instance (search_algo=optuna.samplers.TPESampler(...)), got an "
        "object of type object"
    )
