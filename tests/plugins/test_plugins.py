"""The plug-in seams, worked from outside the package: a toy backend and a toy strategy,
registered by importing modules under ``tests/plugins`` (see conftest.py), validated and
searched for real (no ``raysearch/`` module knows them)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from raysearch.errors import ConfigError
from raysearch.search import AutoSearch
from raysearch.space import SearchSpace
from tests.conftest import TWO_AT_A_TIME

BOTH = {
    "quantizer": ["ort", "toy"],
    "ort_settings": {"only_if": {"quantizer": "ort"}, "per_channel": [True, False]},
    "toy_settings": {"only_if": {"quantizer": "toy"}, "bits": [4, 8]},
}


def test_each_point_is_validated_against_the_catalogue_of_its_backend():
    space = SearchSpace.parse(BOTH)
    settings = [space.to_settings(p) for p in space.expand().points]
    assert settings == [
        {"quantizer": "ort", "per_channel": True},
        {"quantizer": "ort", "per_channel": False},
        {"quantizer": "toy", "bits": 4},
        {"quantizer": "toy", "bits": 8},
    ]


@pytest.mark.parametrize(
    "space, message",
    [
        (
            {"quantizer": ["ort", "toy"], "bits": [4]},
            "search_space.bits: 'bits' is a setting of backend 'toy', not of 'ort': put it in "
            "a group with only_if: {quantizer: toy}",
        ),
        (
            {**BOTH, "toy_settings": {"only_if": {"quantizer": "toy"}, "per_channel": [True]}},
            "search_space.toy_settings.per_channel: unknown key ('per_channel' is a setting of "
            "backend 'ort'",
        ),
        (
            {**BOTH, "toy_settings": {"only_if": {"quantizer": "toy"}, "bits": [4, 32]}},
            "search_space.toy_settings.bits[1]: expected a value <= 16, got 32",
        ),
        (
            {"quantizer": "toy", "rounding": ["nearest", "up"]},
            "search_space.rounding[1]: expected one of nearest, floor, got 'up'",
        ),
        (
            {"quantizer": ["ort", "toyy"]},
            "search_space.quantizer: unknown quantizer backend 'toyy' (did you mean 'toy'?)",
        ),
    ],
    ids=["toy key where ort is active", "ort key in a toy group", "toy bound", "toy enum", "name"],
)
def test_a_key_of_one_backend_under_the_other_is_refused_naming_the_backend(space, message):
    with pytest.raises(ConfigError) as info:
        SearchSpace.parse(space)
    assert message in str(info.value)


def _config(make_config, **overrides):
    return make_config(measure_latency=False, **overrides)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_search_runs_the_toy_backend_beside_onnx_runtime(make_config, mlp_files):
    from tests.plugins.toy_backend import fake_quantize

    # Every trial's model is read below: keep every candidate's.
    config = _config(make_config, search_space=BOTH, tolerance=10.0, keep_candidates=True)
    result = AutoSearch(config).run()
    rows = result.results.to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 4
    toy = [r for r in rows if r["params/quantizer"] == "toy"]
    assert sorted(r["params/toy_settings.bits"] for r in toy) == [4, 8]
    # The toy trials' models are what the toy backend makes: float weights on 2**bits levels.
    float_model = onnx.load(str(mlp_files["model"]))
    w2 = numpy_helper.to_array(next(t for t in float_model.graph.initializer if t.name == "w2"))
    for row in toy:
        kept = result.output_dir / row["model_file"]
        model = onnx.load(str(kept))
        got = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w2"))
        bits = row["params/toy_settings.bits"]
        np.testing.assert_array_equal(got, fake_quantize(w2, bits, "nearest"))
        assert len(np.unique(got)) <= 2**bits - 1


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_two_phase_strategy_refines_around_what_its_first_phase_found(make_config):
    space = {"calibrate_method": ["MinMax", "Percentile", "Entropy"], "per_channel": [True, False]}
    config = _config(
        make_config,
        search_space=space,
        search_algo="ProbeThenRefine",
        plugins=["tests.plugins.toy_strategy"],
        resources=TWO_AT_A_TIME,
    )
    result = AutoSearch(config).run()
    rows = sorted(result.results.to_pylist(), key=lambda r: r["number"])
    assert result.summary["stop_reason"] == "space_exhausted"
    probes, refined = rows[:3], rows[3:]
    # Phase one: one setting per method. Phase two: the rest of the best probe's method only.
    assert sorted(r["params/calibrate_method"] for r in probes) == [
        "Entropy",
        "MinMax",
        "Percentile",
    ]
    best = min(probes, key=lambda r: r["metric"])
    assert [r["params/calibrate_method"] for r in refined] == [best["params/calibrate_method"]]
    assert refined[0]["params/per_channel"] != best["params/per_channel"]


def test_a_config_names_its_plugins_and_a_missing_one_is_one_line(make_config):
    from raysearch.config import SearchConfig

    config = SearchConfig.from_dict(
        make_config(plugins=["tests.plugins.toy_backend"], search_space={"quantizer": "toy"})
    )
    assert config.search_spaces[0].expand().points == [{"quantizer": "toy"}]
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(make_config(plugins=["tests.plugins.no_such_plugin"]))
    assert str(info.value).startswith(
        "plugins[0]: cannot import 'tests.plugins.no_such_plugin': No module named"
    )


def test_plugins_must_be_a_list_of_module_names(make_config):
    from raysearch.config import SearchConfig

    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(make_config(plugins="tests.plugins.toy_backend"))
    assert str(info.value) == (
        "plugins: expected a list of module names, got 'tests.plugins.toy_backend'"
    )
