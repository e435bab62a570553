"""Each validity rule drops what it should and nothing else."""

from __future__ import annotations

from raysearch.space import SearchSpace
from raysearch.space.rules import (
    RULES,
    finetune_params_without_finetune,
    joint_and_split_together,
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
    smoothquant_alpha_without_smoothquant,
)


def test_percentile_without_percentile_method_strips_only_with_other_methods():
    assert percentile_without_percentile_method(
        {"calibrate_method": "MinMax", "extra_options.CalibPercentile": 99.9}
    ) == ["extra_options.CalibPercentile"]
    assert (
        percentile_without_percentile_method(
            {"calibrate_method": "Percentile", "extra_options.CalibPercentile": 99.9}
        )
        == []
    )
    assert percentile_without_percentile_method({"calibrate_method": "Entropy"}) == []


def test_moving_average_constant_needs_moving_average():
    key = "extra_options.CalibMovingAverageConstant"
    assert moving_average_constant_without_moving_average({key: 0.01}) == [key]
    assert moving_average_constant_without_moving_average(
        {key: 0.01, "extra_options.CalibMovingAverage": False}
    ) == [key]
    assert (
        moving_average_constant_without_moving_average(
            {key: 0.01, "extra_options.CalibMovingAverage": True}
        )
        == []
    )


def test_smoothquant_alpha_needs_smoothquant():
    point = {"extra_options.SmoothQuantAlpha": 0.5, "extra_options.SmoothQuantFolding": True}
    assert smoothquant_alpha_without_smoothquant(point) == list(point)
    assert smoothquant_alpha_without_smoothquant({**point, "extra_options.SmoothQuant": True}) == []


def test_finetune_params_need_finetuning_switched_on():
    point = {"algorithm": "none", "num_iterations": 100, "per_channel": True}
    assert finetune_params_without_finetune(point) == ["num_iterations"]
    assert finetune_params_without_finetune({**point, "algorithm": "adaquant"}) == []
    assert finetune_params_without_finetune({"per_channel": True}) == []


def test_joint_parameter_wins_over_its_split_parts():
    point = {"g.NumIterLR": [1000, 0.1], "NumIterations": 5, "LearningRate": 0.3}
    assert joint_and_split_together(point) == ["NumIterations", "LearningRate"]
    assert joint_and_split_together({"NumIterations": 5}) == []


def test_rules_are_counted_when_they_make_settings_duplicates():
    raw = {
        "calibrate_method": ["MinMax", "Percentile", "Entropy"],
        "extra_options": {
            "CalibPercentile": [99.9, 99.99],
            "CalibMovingAverage": [False],
            "CalibMovingAverageConstant": [0.01, 0.001],
        },
    }
    expansion = SearchSpace.parse(raw).expand()
    # MinMax and Entropy: 1 each; Percentile: 2 percentiles. The constant never acts.
    assert len(expansion) == 4
    assert expansion.total == 12
    assert expansion.dropped == {
        "moving_average_constant_without_moving_average": 6,
        "percentile_without_percentile_method": 2,
    }


def test_every_rule_is_a_named_function():
    assert {r.__name__ for r in RULES} == {
        "joint_and_split_together",
        "finetune_params_without_finetune",
        "moving_average_constant_without_moving_average",
        "percentile_without_percentile_method",
        "smoothquant_alpha_without_smoothquant",
    }
