"""The NNCF backend's settings catalogue (NNCF 3.4's names: ``nncf.quantize``'s arguments and
the ``AdvancedQuantizationParameters`` that change an ONNX model) and its refusals. Pure data,
so that an install without NNCF validates too.

Example:
    >>> NNCF_CATALOGUE.spec("", "preset").choices
    ('performance', 'mixed')
    >>> NNCF_CATALOGUE.check("smooth_quant_alphas", "matmul", 1.5)
    'expected a value <= 1.0, got 1.5'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raysearch.quantize.nncf_runtime import missing_nncf  # re-exported
from raysearch.quantize.registry import first_refusal
from raysearch.space.catalogue import QUANTIZER, Catalogue, OptionSpec, register_catalogue

__all__ = [
    "NNCF_CATALOGUE",
    "SETTINGS",
    "SMOOTH_QUANT_ALPHAS",
    "IGNORED_SCOPE",
    "ACTIVATION_ESTIMATORS",
    "WEIGHT_ESTIMATORS",
    "PROPAGATION_RULES",
    "REJECT_RULES",
    "reject_reason",
    "reject_transformer_bias_correction",
    "reject_mixed_precision",
    "missing_nncf",
]

#: ``RangeEstimatorParametersSet`` members, lower case; for weights only the two that differ
#: (NNCF collects one sample of a weight, where the others equal ``minmax``).
ACTIVATION_ESTIMATORS = (
    "minmax",
    "mean_minmax",
    "median_minmax",
    "mean_no_outliers_minmax",
    "mean_quantile",
    "histogram",
)
WEIGHT_ESTIMATORS = ("minmax", "mean_quantile")
#: ``QuantizerPropagationRule`` members, lower case (NNCF's default: ``merge_all_in_one``).
PROPAGATION_RULES = (
    "do_not_merge_branches",
    "merge_if_all_branches_same",
    "merge_with_potential_requantization",
    "merge_all_in_one",
)


def _bool(doc: str) -> OptionSpec:
    return OptionSpec("bool", doc)


#: Top-level settings: ``nncf.quantize``'s arguments and the advanced parameters.
SETTINGS: dict[str, OptionSpec] = {
    "quantizer": QUANTIZER,
    "preset": OptionSpec(
        "enum",
        "performance: symmetric activations and weights; mixed: asymmetric activations "
        "(NNCF's default: mixed for transformers, else performance)",
        ("performance", "mixed"),
    ),
    "model_type": OptionSpec(
        "enum",
        "transformer: NNCF's transformer patterns and SmoothQuant; none: neither",
        ("none", "transformer"),
    ),
    "target_device": OptionSpec(
        "enum", "the hardware whose quantization rules apply", ("ANY", "CPU", "GPU", "NPU")
    ),
    "subset_size": OptionSpec(
        "int", "calibration samples NNCF collects statistics on (default 300)", low=1
    ),
    "fast_bias_correction": _bool(
        "true: FastBiasCorrection (NNCF's default); false: BiasCorrection, slower"
    ),
    "disable_bias_correction": _bool("skip NNCF's bias correction"),
    "bias_correction_threshold": OptionSpec(
        "float", "largest bias shift NNCF's bias correction applies", low=0.0
    ),
    "smooth_quant_alphas": OptionSpec(
        "dict", "SmoothQuant alpha per op type (model_type: transformer; see its keys)"
    ),
    "activations_range_estimator": OptionSpec(
        "enum",
        "how activation ranges are estimated (NNCF's default: mean_minmax)",
        ACTIVATION_ESTIMATORS,
    ),
    "weights_range_estimator": OptionSpec(
        "enum", "how weight ranges are estimated (NNCF's default: minmax)", WEIGHT_ESTIMATORS
    ),
    "weights_per_channel": _bool("quantize weights per output channel (NNCF's default: true)"),
    "overflow_fix": OptionSpec(
        "enum",
        "weights on half the int8 range: all (enable), the first layers (NNCF's default), or none",
        ("enable", "first_layer_only", "disable"),
    ),
    "quantizer_propagation_rule": OptionSpec(
        "enum", "how quantizers merge across branches", PROPAGATION_RULES
    ),
    "ignored_scope": OptionSpec("dict", "nodes NNCF leaves in float (see its keys)"),
    # No NNCF setting lives here: the techniques add theirs.
    "extra_options": OptionSpec("dict", "the techniques' options (raysearch's, not NNCF's)"),
}

#: ``smooth_quant_alphas`` keys (``AdvancedSmoothQuantParameters``); a negative alpha
#: switches SmoothQuant off for that op type.
SMOOTH_QUANT_ALPHAS: dict[str, OptionSpec] = {
    "matmul": OptionSpec(
        "float", "MatMul alpha (NNCF's default 0.95; -1: off)", low=-1.0, high=1.0
    ),
    "convolution": OptionSpec("float", "Conv alpha (NNCF's default -1: off)", low=-1.0, high=1.0),
}

#: ``ignored_scope`` keys (``nncf.IgnoredScope``); each must match something in the model.
IGNORED_SCOPE: dict[str, OptionSpec] = {
    "types": OptionSpec("str_list", "op types left in float"),
    "names": OptionSpec("str_list", "node names left in float"),
    "patterns": OptionSpec("str_list", "regular expressions of node names left in float"),
}

#: The ``nncf`` backend's catalogue, registered for the space to validate against.
NNCF_CATALOGUE = register_catalogue(
    Catalogue(
        "nncf",
        SETTINGS,
        {
            "smooth_quant_alphas": SMOOTH_QUANT_ALPHAS,
            "ignored_scope": IGNORED_SCOPE,
            "extra_options": {},
        },
    )
)


# Refusals: each accepts the nested settings a trial gets


def reject_transformer_bias_correction(settings: Mapping[str, Any]) -> str | None:
    """NNCF 3.4's BiasCorrection after SmoothQuant defines a tensor twice where one feeds several
    biased MatMuls (attention's Q, K, V): ONNX Runtime refuses the model.
    """
    if settings.get("model_type") != "transformer":
        return None
    if settings.get("fast_bias_correction") is not False or settings.get("disable_bias_correction"):
        return None
    return (
        "NNCF 3.4's BiasCorrection (fast_bias_correction: false) fails on transformer models "
        "(a duplicate SmoothQuant output name); use fast_bias_correction: true"
    )


def reject_mixed_precision(settings: Mapping[str, Any]) -> str | None:
    """Mixed precision's ranking reads ONNX Runtime's Q/DQ names, which NNCF does not write."""
    options = settings.get("mixed_precision")
    if not isinstance(options, Mapping):
        return None
    chosen = [str(v) for k, v in options.items() if k.startswith("rank_")]
    if int(options.get("top_k") or 0) > 0:
        chosen.append(str(options.get("promote_to") or "int16"))
    if any(p != "int8" for p in chosen):
        return (
            "mixed_precision ranks tensors by ONNX Runtime's Q/DQ names, which NNCF's models do "
            "not use: use quantizer ort, or ignored_scope with quantizer nncf"
        )
    return None


#: Every refusal, in the order :func:`reject_reason` applies them.
REJECT_RULES: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    reject_transformer_bias_correction,
    reject_mixed_precision,
)


def reject_reason(settings: Mapping[str, Any]) -> str | None:
    """The first refusal of ``settings`` (one line), or None."""
    return first_refusal(REJECT_RULES, settings)
