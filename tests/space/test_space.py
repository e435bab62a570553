"""Search-space language: both dialects, grid expansion, define-by-run, settings."""

from __future__ import annotations

import optuna

from raysearch.space import Categorical, IntRange, SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: Every key is a real setting: the product's schema-checked path parses it.
CONDITIONAL = {
    "calibrate_method": ["MinMax", "Percentile", "Entropy"],
    "entropy_params": {
        "only_if": {"calibrate_method": "Entropy"},
        "extra_options": {"num_bins": [512, 1024], "num_quantized_bins": [128, 256]},
    },
    "percentile_params": {
        "only_if": {"calibrate_method": "Percentile"},
        "precision": {
            "joint": ["activation_type", "weight_type"],
            "choices": [["QUInt8", "QInt8"], ["QUInt16", "QInt8"]],
        },
    },
    "per_channel": [True, False],
    "reduce_range": [False],
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
    space = SearchSpace.parse(CONDITIONAL)
    expansion = space.expand()
    # MinMax (1) + Percentile (2 joint choices) + Entropy (2 x 2 = 4), times per_channel (2).
    assert len(expansion) == (1 + 2 + 4) * 2
    assert expansion.dropped == {}
    for point in expansion.points:
        if point["calibrate_method"] != "Entropy":
            assert not any(k.startswith("entropy_params.") for k in point)
        if point["calibrate_method"] != "Percentile":
            assert "percentile_params.precision" not in point


def test_nested_only_if_groups_count_exactly():
    raw = {
        "calibrate_method": ["MinMax", "Entropy"],
        "outer": {
            "only_if": {"calibrate_method": "Entropy"},
            "extra_options": {"num_bins": [128, 512, 1024]},
            "inner": {"only_if": {"num_bins": [512, 1024]}, "per_channel": [True, False]},
        },
    }
    # MinMax: 1; Entropy: 128 bins -> 1, 512 or 1024 -> 2 each => 1 + 1 + 4 = 6.
    assert len(SearchSpace.parse(raw).expand()) == 6


def test_only_if_with_a_key_name_is_active_when_that_key_is_truthy():
    raw = {
        "extra_options": {
            "CalibMovingAverage": [True, False],
            "ma": {"only_if": "CalibMovingAverage", "CalibMovingAverageConstant": [0.01, 0.1]},
        }
    }
    points = SearchSpace.parse(raw).expand().points
    assert points == [
        {
            "extra_options.CalibMovingAverage": True,
            "extra_options.ma.CalibMovingAverageConstant": 0.01,
        },
        {
            "extra_options.CalibMovingAverage": True,
            "extra_options.ma.CalibMovingAverageConstant": 0.1,
        },
        {"extra_options.CalibMovingAverage": False},
    ]


def test_condition_order_does_not_depend_on_declaration_order():
    raw = {
        "g": {"only_if": {"per_channel": True}, "reduce_range": [True, False]},
        "per_channel": [True, False],
    }
    space = SearchSpace.parse(raw)
    assert [p.name for p in space.params] == ["per_channel", "g.reduce_range"]
    assert len(space.expand()) == 3


def test_joint_parameter_sets_both_values_and_drops_group_names():
    space = SearchSpace.parse(CONDITIONAL)
    point = {
        "calibrate_method": "Percentile",
        "percentile_params.precision": ["QUInt16", "QInt8"],
        "per_channel": True,
        "reduce_range": False,
    }
    assert space.to_settings(point) == {
        "calibrate_method": "Percentile",
        "activation_type": "QUInt16",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": False,
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
    assert all(p["weight_type"] == "QInt8" for p in space.expand().points)
    study = optuna.create_study()
    trial = study.ask()
    point = space.sample(trial)
    assert point["weight_type"] == "QInt8"
    assert set(trial.params) == {"per_channel"}  # the fixed setting is not suggested


def test_define_by_run_never_suggests_an_inactive_group_over_200_trials():
    space = SearchSpace.parse(CONDITIONAL)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        point = space.sample(trial)
        method = point["calibrate_method"]
        for name in trial.params:
            if name.startswith("entropy_params."):
                assert method == "Entropy"
            if name.startswith("percentile_params."):
                assert method == "Percentile"
        seen.add(method)
        study.tell(trial, float(len(point)))
    assert seen == {"MinMax", "Percentile", "Entropy"}


def test_sample_returns_real_values_for_list_choices():
    space = SearchSpace.parse({"op_types_to_quantize": [["MatMul", "Conv"], None]})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = {repr(space.sample(study.ask())["op_types_to_quantize"]) for _ in range(30)}
    assert values == {"['MatMul', 'Conv']", "None"}


def test_ranges_are_suggested_with_their_bounds():
    space = SearchSpace.parse(
        {
            "calibrate_method": ["Entropy"],
            "p": {
                "only_if": {"calibrate_method": "Entropy"},
                "extra_options": {
                    "num_bins": {"type": "int", "low": 128, "high": 2048, "step": 128},
                    "CalibMovingAverageConstant": {
                        "type": "float",
                        "low": 1e-6,
                        "high": 1e-3,
                        "log": True,
                    },
                },
            },
        },
    )
    assert space.params[1].domain == IntRange(128, 2048, 128)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        point = space.sample(study.ask())
        assert point["p.extra_options.num_bins"] % 128 == 0
        assert 1e-6 <= point["p.extra_options.CalibMovingAverageConstant"] <= 1e-3


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
