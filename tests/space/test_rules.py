"""Each validity rule drops what it should and nothing else."""

from __future__ import annotations

from raysearch.space import SearchSpace
from raysearch.space.rules import (
    RULES,
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
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
        "moving_average_constant_without_moving_average",
        "percentile_without_percentile_method",
        "mixed_precision_without_promotion",
        "static_settings_in_dynamic_mode",
        "smooth_quant_alphas_without_transformer",
        "bias_correction_settings_without_bias_correction",
        "weight_compression_settings_without_effect",
    }
