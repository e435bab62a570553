"""points_to_evaluate: settings a search runs first, resolved against the space, refused with
one line when they are no point of it, and run first by the samplers and the grid."""

from __future__ import annotations

import pytest
from ray.tune.search import Searcher

from raysearch.config import SearchConfig
from raysearch.config._spaces import parse_spaces
from raysearch.errors import ConfigError
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.space import SearchSpace
from raysearch.space.points import resolve_point
from raysearch.strategies.samplers import quiet_optuna

TWO_BACKENDS = {
    "quantizer": ["ort", "nncf"],
    "ort": {
        "only_if": {"quantizer": "ort"},
        "calibrate_method": ["MinMax", "Percentile"],
        "per_channel": [True, False],
        "extra_options": {"CalibPercentile": [99.99, 99.999]},
    },
    "nncf": {
        "only_if": {"quantizer": "nncf"},
        "model_type": ["transformer", "none"],
        "preset": ["performance", "mixed"],
    },
}


def test_short_names_nested_groups_and_fixed_settings_resolve_to_the_full_point():
    space = SearchSpace.parse(
        {**TWO_BACKENDS, "ort": {**TWO_BACKENDS["ort"], "weight_type": ["QInt8"]}}
    )
    point = resolve_point(
        space,
        {
            "quantizer": "ort",
            "calibrate_method": "Percentile",
            "extra_options": {"CalibPercentile": 99.999},
        },
    )
    assert point == {
        "quantizer": "ort",
        "ort.calibrate_method": "Percentile",
        "ort.extra_options.CalibPercentile": 99.999,
        "ort.weight_type": "QInt8",  # fixed: filled in
    }  # per_channel left to the searcher


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"quantizer": "ort", "preset": "mixed"},
         "points_to_evaluate[0].preset: is not active in this point "
         "(its group's only_if does not hold)"),
        ({"quantizer": "ort", "calibrate_metod": "MinMax"},
         "points_to_evaluate[0].calibrate_metod: is not a parameter of the space "
         "(did you mean 'ort.calibrate_method'?)"),
        ({"quantizer": "tflite"},
         "points_to_evaluate[0].quantizer: 'tflite' is not one of the space's choices "
         "('ort', 'nncf')"),
        ({"quantizer": "ort", "per_channel": 1},
         "points_to_evaluate[0].per_channel: 1 is not one of the space's choices (True, False)"),
        ([], "points_to_evaluate: expected a non-empty list of settings"),
    ],
)  # fmt: skip
def test_a_point_that_is_not_one_of_the_space_is_refused_with_one_line(raw, message):
    with pytest.raises(ConfigError) as error:
        parse_spaces(
            {"search_space": TWO_BACKENDS, "points_to_evaluate": raw if raw == [] else [raw]}
        )
    assert str(error.value) == message


def test_the_search_algorithms_that_choose_their_own_start_refuse_points():
    with pytest.raises(ConfigError, match="^points_to_evaluate: Fallback chooses its own"):
        SearchConfig.from_dict(
            {"model": "m.onnx", "calibration_data": "c.npz", "search_space": TWO_BACKENDS,
             "search_algo": "Fallback", "points_to_evaluate": [{"quantizer": "ort"}]},
            check_paths=False,
        )  # fmt: skip


@pytest.mark.parametrize("algo", ["TPE", "Random", "QMC"])
def test_a_sampler_runs_the_start_points_first_then_samples(algo):
    starts = [
        {"quantizer": "nncf", "model_type": "none", "preset": "mixed"},
        {"quantizer": "ort", "calibrate_method": "Percentile", "per_channel": False,
         "extra_options": {"CalibPercentile": 99.999}},
    ]  # fmt: skip
    spaces = parse_spaces({"search_space": TWO_BACKENDS, "points_to_evaluate": starts})
    with quiet_optuna():
        searcher = SettingSearcher.strategy(algo, spaces, mode="max", seed=3, max_trials=6)
        params = []
        for i in range(6):
            config = searcher.suggest(f"t{i}")
            assert config not in (None, Searcher.FINISHED)
            params.append(config["params"])
            searcher.on_trial_complete(f"t{i}", {"metric": 0.5, "objective": 0.5})
    assert params[0] == {"quantizer": "nncf", "nncf.model_type": "none", "nncf.preset": "mixed"}
    assert params[1] == {
        "quantizer": "ort",
        "ort.calibrate_method": "Percentile",
        "ort.per_channel": False,
        "ort.extra_options.CalibPercentile": 99.999,
    }
    assert len({str(sorted(p.items())) for p in params}) == 6


def test_a_partial_start_point_leaves_the_rest_to_the_sampler():
    spaces = parse_spaces(
        {
            "search_space": TWO_BACKENDS,
            "points_to_evaluate": [{"quantizer": "nncf", "preset": "mixed"}],
        }
    )
    with quiet_optuna():
        first = SettingSearcher.strategy("TPE", spaces, mode="max", seed=0).suggest("t0")
    assert first["params"]["quantizer"] == "nncf" and first["params"]["nncf.preset"] == "mixed"
    assert first["params"]["nncf.model_type"] in ("transformer", "none")


def test_the_grid_runs_the_first_setting_agreeing_with_each_start_point_first():
    starts = [{"quantizer": "nncf", "preset": "mixed"}, {"quantizer": "ort", "per_channel": False}]
    spaces = parse_spaces({"search_space": TWO_BACKENDS, "points_to_evaluate": starts})
    searcher = SettingSearcher.strategy("Grid", spaces, mode="max")
    configs = [searcher.suggest(f"t{i}") for i in range(10)]  # 6 ONNX Runtime, 4 NNCF
    assert configs[0]["params"] == {
        "quantizer": "nncf",
        "nncf.model_type": "transformer",
        "nncf.preset": "mixed",
    }
    assert (
        configs[1]["params"]["quantizer"] == "ort"
        and configs[1]["params"]["ort.per_channel"] is False
    )
    # Every setting still runs once.
    assert len({c["key"] for c in configs}) == 10
    assert searcher.suggest("t10") == Searcher.FINISHED


def test_auto_int8_search_starts_from_each_backends_one_shot():
    (space,) = parse_spaces({"search_space": "AUTO_INT8_SEARCH"})
    nncf, ort = space.points_to_evaluate
    assert nncf["quantizer"] == "nncf" and nncf["nncf.model_type"] == "transformer"
    assert nncf["nncf.preset"] == "mixed" and nncf["nncf.smooth_quant_alphas.matmul"] == 0.95
    assert ort["quantizer"] == "ort" and ort["ort.calibrate_method"] == "MinMax"
