"""Validity rules: each a function of a point returning the key paths meaningless in it, which
are stripped (``MinMax`` with ``CalibPercentile`` is plain ``MinMax``). :func:`reads` names
the keys a rule looks at, so a grid memoises it on them.

Example:
    >>> percentile_without_percentile_method(
    ...     {"calibrate_method": "MinMax", "extra_options.CalibPercentile": 99.9})
    ['extra_options.CalibPercentile']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "Rule",
    "RULES",
    "reads",
    "mixed_precision_without_promotion",
    "moving_average_constant_without_moving_average",
    "percentile_without_percentile_method",
    "static_settings_in_dynamic_mode",
    "smooth_quant_alphas_without_transformer",
    "bias_correction_settings_without_bias_correction",
    "weight_compression_settings_without_effect",
    "FOUR_BIT_ONLY",
]

Point = dict[str, Any]
Rule = Callable[[Point], list[str]]


def reads(test: Callable[[str], bool]) -> Callable[[Rule], Rule]:
    """Declare the keys whose values a rule reads, so that a grid memoises it on them.

    Example:
        >>> percentile_without_percentile_method.reads("calibrate_method")
        True
    """

    def declare(rule: Rule) -> Rule:
        rule.reads = test  # type: ignore[attr-defined]
        return rule

    return declare


def _leaf_in(*leaves: str) -> Callable[[str], bool]:
    """A :func:`reads` test: the keys whose last dotted part is one of ``leaves``."""
    names = frozenset(leaves)
    return lambda key: key.rsplit(".", 1)[-1] in names


def _keys(point: Point, leaf: str) -> list[str]:
    return [k for k in point if k.rsplit(".", 1)[-1] == leaf]


def _value(point: Point, leaf: str, default: Any = None) -> Any:
    keys = _keys(point, leaf)
    return point[keys[0]] if keys else default


@reads(_leaf_in("CalibMovingAverage"))
def moving_average_constant_without_moving_average(point: Point) -> list[str]:
    """``CalibMovingAverageConstant`` only acts when ``CalibMovingAverage`` is true."""
    if _value(point, "CalibMovingAverage") is True:
        return []
    return _keys(point, "CalibMovingAverageConstant")


@reads(_leaf_in("calibrate_method"))
def percentile_without_percentile_method(point: Point) -> list[str]:
    """``CalibPercentile`` only acts with ``calibrate_method: Percentile``."""
    if _value(point, "calibrate_method") == "Percentile":
        return []
    return _keys(point, "CalibPercentile")


@reads(lambda key: key.startswith("mixed_precision."))
def mixed_precision_without_promotion(point: Point) -> list[str]:
    """``mixed_precision`` keys that do nothing: ``rank_<i>: int8`` past ``top_k``, the rest
    with nothing promoted, ``promote_weights`` with nothing at 16 bits.

    Example:
        >>> mixed_precision_without_promotion({"mixed_precision.top_k": 2,
        ...     "mixed_precision.promote_to": "float", "mixed_precision.promote_weights": True})
        ['mixed_precision.promote_weights']
    """
    prefix = "mixed_precision."
    keys = [k for k in point if k.startswith(prefix)]
    if not keys:
        return []
    top_k = point.get(prefix + "top_k") or 0
    strip = []
    promoting = top_k > 0
    for key in keys:
        leaf = key[len(prefix) :]
        if leaf.startswith("rank_") and leaf[5:].isdigit():
            if point[key] == "int8" and int(leaf[5:]) > top_k:
                strip.append(key)
            elif point[key] != "int8":
                promoting = True
    if not promoting:
        strip += [
            k
            for k in keys
            if k[len(prefix) :]
            in ("promote_to", "promote_weights", "rank_by", "samples", "candidates")
        ]
    elif not _sixteen_bit_promotion(point, prefix, top_k):
        strip += [k for k in keys if k == prefix + "promote_weights"]
    return sorted(set(strip), key=keys.index)


def _sixteen_bit_promotion(point: Point, prefix: str, top_k: int) -> bool:
    """Whether a ``mixed_precision`` point promotes any entry to 16 bits."""
    if top_k > 0 and point.get(prefix + "promote_to", "int16") != "float":
        return True
    return any(
        k.startswith(prefix + "rank_") and v not in ("int8", "float") for k, v in point.items()
    )


# What ``quantize_dynamic`` does not read: the graph format, activation types and
# ranges, output and bias handling of the QDQ quantizer, and the techniques that work on
# calibrated QDQ graphs (tensor overrides, power-of-two scales, bias correction, fine-tuning).
_STATIC_ONLY = frozenset(
    {
        "quant_format",
        "calibrate_method",
        "activation_type",
        "ActivationSymmetric",
        "ActivationRestrictedAsymmetric",
        "AddQDQPairToWeight",
        "OpTypesToExcludeOutputQuantization",
        "DedicatedQDQPair",
        "QDQOpTypePerChannelSupportToAxis",
        "QDQKeepRemovableActivations",
        "QDQDisableWeightAdjustForInt32Bias",
        "UseQDQContribOps",
        "QuantizeBias",
        "MinimumRealRange",
        "TensorQuantOverrides",
        "CalibTensorRangeSymmetric",
        "CalibMovingAverage",
        "CalibMovingAverageConstant",
        "CalibStridedMinMax",
        "CalibMaxIntermediateOutputs",
        "CalibPercentile",
        "num_bins",
        "num_quantized_bins",
        "scenario",
        "PowerOfTwoMethod",
        "include_bias_correction",
        "include_fast_ft",
    }
)


@reads(_leaf_in("quant_mode"))
def static_settings_in_dynamic_mode(point: Point) -> list[str]:
    """``quant_mode: dynamic`` calibrates nothing and writes no QDQ graph: those settings go.

    Example:
        >>> static_settings_in_dynamic_mode({"quant_mode": "dynamic", "per_channel": True,
        ...     "calibrate_method": "Entropy", "extra_options.ActivationSymmetric": True})
        ['calibrate_method', 'extra_options.ActivationSymmetric']
    """
    if _value(point, "quant_mode") != "dynamic":
        return []
    return [
        k
        for k in point
        if k.rsplit(".", 1)[-1] in _STATIC_ONLY
        or k.startswith("mixed_precision.")
        or k.rsplit(".", 1)[-1].startswith("FastFinetune")
    ]


@reads(_leaf_in("model_type"))
def smooth_quant_alphas_without_transformer(point: Point) -> list[str]:
    """NNCF runs SmoothQuant only with ``model_type: transformer``."""
    if _value(point, "model_type") == "transformer":
        return []
    return [k for k in point if "smooth_quant_alphas" in k.split(".")[:-1]]


@reads(_leaf_in("disable_bias_correction"))
def bias_correction_settings_without_bias_correction(point: Point) -> list[str]:
    """NNCF's bias correction settings with ``disable_bias_correction: true``."""
    if _value(point, "disable_bias_correction") is not True:
        return []
    return _keys(point, "fast_bias_correction") + _keys(point, "bias_correction_threshold")


#: ``nncf_weight_only``'s keys that act with a 4-bit ``mode`` only (no other catalogue has
#: them; the backend's options refuse them with an 8-bit mode).
FOUR_BIT_ONLY = (
    "group_size",
    "ratio",
    "sensitivity_metric",
    "backup_mode",
    "all_layers",
    "awq",
    "scale_estimation",
    "group_size_fallback_mode",
)


@reads(_leaf_in("mode", "ratio"))
def weight_compression_settings_without_effect(point: Point) -> list[str]:
    """NNCF ``compress_weights``: an 8-bit ``mode`` (the default) makes the 4-bit keys do
    nothing; ``ratio`` 1 makes ``sensitivity_metric`` do nothing.

    Example:
        >>> weight_compression_settings_without_effect({"mode": "int8_sym",
        ...     "group_size": 32, "ratio": 0.8})
        ['group_size', 'ratio']
    """
    present = [k for k in point if k.rsplit(".", 1)[-1] in FOUR_BIT_ONLY]
    if not present:
        return []
    if _value(point, "mode", "int8_asym") in ("int8_sym", "int8_asym"):
        return present
    if _value(point, "ratio", 1.0) >= 1:
        return _keys(point, "sensitivity_metric")
    return []


#: Every rule, in the order they are applied. A rule's name is its function name.
RULES: tuple[Rule, ...] = (
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
    mixed_precision_without_promotion,
    static_settings_in_dynamic_mode,
    smooth_quant_alphas_without_transformer,
    bias_correction_settings_without_bias_correction,
    weight_compression_settings_without_effect,
)
