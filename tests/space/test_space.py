"""Search-space language: both dialects, grid expansion, define-by-run, settings."""

from __future__ import annotations

import optuna

from raysearch.space import Categorical, IntRange, SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

CONDITIONAL = {
    "algorithm": ["none", "adaround", "adaquant"],
    "adaquant_params": {
        "only_if": {"algorithm": "adaquant"},
        "num_iterations": [100, 200],
        "learning_rate": [1e-5, 1e-4],
    },
    "adaround_params": {
        "only_if": {"algorithm": "adaround"},
        "NumIterLR": [[1000, 0.1], [3000, 0.05]],
    },
    "per_channel": [True, False],
    "weight_type": ["QInt8"],
}


def test_flat_and_explicit_dialects_parse_to_the_same_tree():
    flat = {
        "calibrate_method": ["MinMax", "Percentile"],
        "per_channel": [True, False],
        "op_types_to_quantize": [["MatMul", "Conv"], None],
        "extra_options": {"ActivationSymmetric": [True, False], "Percentile": [99.9]},
    }
    explicit = {
        "calibrate_method": {"type": "categorical", "choices": ["MinMax", "Percentile"]},
        "per_channel": {"choices": [True, False]},
        "op_types_to_quantize": {"choices": [["MatMul", "Conv"], None]},
        "extra_options": {
            "ActivationSymmetric": {"choices": [True, False]},
            "CalibPercentile": 99.9,
        },
    }
    assert SearchSpace.parse(flat).root == SearchSpace.parse(explicit).root


def test_only_if_groups_expand_to_one_plus_two_plus_four_times_the_rest():
    space = SearchSpace.parse(CONDITIONAL, schema=False)
    expansion = space.expand()
    # algorithm: none (1) + adaround (2) + adaquant (2 x 2 = 4), times per_channel (2).
    assert len(expansion) == (1 + 2 + 4) * 2
    assert expansion.dropped == {}
    for point in expansion.points:
        if point["algorithm"] != "adaquant":
            assert not any(k.startswith("adaquant_params.") for k in point)
        if point["algorithm"] != "adaround":
            assert "adaround_params.NumIterLR" not in point


def test_nested_only_if_groups_count_exactly():
    raw = {
        "a": ["x", "y"],
        "outer": {
            "only_if": {"a": "y"},
            "b": [1, 2, 3],
            "inner": {"only_if": {"b": [2, 3]}, "c": [True, False]},
        },
    }
    # a=x: 1; a=y: b=1 -> 1, b in {2,3} -> 2 each => 1 + 1 + 4 = 6.
    assert len(SearchSpace.parse(raw, schema=False).expand()) == 6


def test_only_if_with_a_key_name_is_active_when_that_key_is_truthy():
    raw = {
        "extra_options": {
            "SmoothQuant": [True, False],
            "sq": {"only_if": "SmoothQuant", "SmoothQuantAlpha": [0.5, 0.8]},
        }
    }
    points = SearchSpace.parse(raw).expand().points
    assert points == [
        {"extra_options.SmoothQuant": True, "extra_options.sq.SmoothQuantAlpha": 0.5},
        {"extra_options.SmoothQuant": True, "extra_options.sq.SmoothQuantAlpha": 0.8},
        {"extra_options.SmoothQuant": False},
    ]


def test_condition_order_does_not_depend_on_declaration_order():
    raw = {"g": {"only_if": {"mode": "on"}, "k": [1, 2]}, "mode": ["on", "off"]}
    space = SearchSpace.parse(raw, schema=False)
    assert [p.name for p in space.params] == ["mode", "g.k"]
    assert len(space.expand()) == 3


def test_joint_parameter_sets_both_values_and_drops_group_names():
    space = SearchSpace.parse(CONDITIONAL, schema=False)
    point = {
        "algorithm": "adaround",
        "adaround_params.NumIterLR": [3000, 0.05],
        "per_channel": True,
        "weight_type": "QInt8",
    }
    assert space.to_settings(point) == {
        "algorithm": "adaround",
        "NumIterations": 3000,
        "LearningRate": 0.05,
        "per_channel": True,
        "weight_type": "QInt8",
    }


def test_settings_keep_extra_options_nested_and_resolve_aliases():
    space = SearchSpace.parse(
        {"calibrate_method": ["Percentile"], "extra_options": {"Percentile": [99.99]}}
    )
    (point,) = space.expand().points
    assert space.to_settings(point) == {
        "calibrate_method": "Percentile",
        "extra_options": {"CalibPercentile": 99.99},
    }


def test_fixed_settings_are_passed_to_every_point_and_sample():
    space = SearchSpace.parse({"per_channel": [True, False], "weight_type": ["QInt8"]})
    assert space.fixed() == {"weight_type": "QInt8"}
    assert all(p["weight_type"] == "QInt8" for p in space.expand().points)
    study = optuna.create_study()
    trial = study.ask()
    point = space.sample(trial)
    assert point["weight_type"] == "QInt8"
    assert set(trial.params) == {"per_channel"}  # the fixed setting is not suggested


def test_define_by_run_never_suggests_an_inactive_group_over_200_trials():
    space = SearchSpace.parse(CONDITIONAL, schema=False)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        point = space.sample(trial)
        algo = point["algorithm"]
        for name in trial.params:
            if name.startswith("adaquant_params."):
                assert algo == "adaquant"
            if name.startswith("adaround_params."):
                assert algo == "adaround"
        seen.add(algo)
        study.tell(trial, float(len(point)))
    assert seen == {"none", "adaround", "adaquant"}


def test_sample_returns_real_values_for_list_choices():
    space = SearchSpace.parse({"op_types_to_quantize": [["MatMul", "Conv"], None]})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = {repr(space.sample(study.ask())["op_types_to_quantize"]) for _ in range(30)}
    assert values == {"['MatMul', 'Conv']", "None"}


def test_ranges_are_suggested_with_their_bounds():
    space = SearchSpace.parse(
        {
            "algorithm": ["adaquant"],
            "p": {
                "only_if": {"algorithm": "adaquant"},
                "num_iterations": {"type": "int", "low": 100, "high": 2000, "step": 100},
                "learning_rate": {"type": "float", "low": 1e-6, "high": 1e-3, "log": True},
            },
        },
        schema=False,
    )
    assert space.params[1].domain == IntRange(100, 2000, 100)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        point = space.sample(study.ask())
        assert point["p.num_iterations"] % 100 == 0
        assert 1e-6 <= point["p.learning_rate"] <= 1e-3


def test_duplicate_choices_are_removed_from_the_grid():
    space = SearchSpace.parse({"per_channel": [True, True, False]})
    expansion = space.expand()
    assert expansion.points == [{"per_channel": True}, {"per_channel": False}]
    assert expansion.dropped == {"duplicate": 1}


def test_reject_check_drops_settings_and_counts_them_by_reason():
    space = SearchSpace.parse(
        {"quant_format": ["QDQ", "QOperator"], "activation_type": ["QUInt8", "QInt16"]}
    )

    def reject(settings):
        if settings["quant_format"] == "QOperator" and settings["activation_type"] == "QInt16":
            return "qoperator_with_16_bit"
        return None

    expansion = space.expand(reject=reject)
    assert len(expansion) == 3
    assert expansion.dropped == {"qoperator_with_16_bit": 1}


def test_categorical_labels_round_trip():
    domain = Categorical((["MatMul"], None))
    assert [domain.from_label(label) for label in domain.labels] == [["MatMul"], None]
