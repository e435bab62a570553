"""Combinations ONNX Runtime refuses, as named rules ``(settings) -> reason | None``.

Each rule accepts nested settings or a flat point keyed by dotted key paths, so the search,
``raysearch validate`` and ``raysearch spaces`` apply the same rules before any trial runs;
:func:`reject_reason` applies them in order.

Example:
    >>> reject_reason({"quant_format": "QOperator", "activation_type": "QUInt16"})
    'QOperator format supports 8-bit types only; QUInt16 needs quant_format QDQ'
    >>> reject_reason({"calibrate_method": "Entropy", "extra_options.num_quantized_bins": 256})
    'Entropy needs num_quantized_bins <= num_bins, got 256 > 128'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DEFAULTS",
    "REJECT_RULES",
    "reject_reason",
    "reject_qoperator_16bit",
    "reject_qoperator_4bit",
    "reject_qoperator_float8",
    "reject_int8_activation_uint8_weight",
    "reject_dynamic_weight_type",
    "reject_float8_mixed",
    "reject_float8_without_distribution",
    "reject_entropy_quantized_bins_over_bins",
    "reject_distribution_few_bins",
]

#: ``quantize_static``'s defaults for the settings the rules read.
DEFAULTS: dict[str, Any] = {
    "quant_format": "QDQ",
    "calibrate_method": "MinMax",
    "activation_type": "QInt8",
    "weight_type": "QInt8",
}
_SIXTEEN = ("QInt16", "QUInt16")
_FOUR = ("QInt4", "QUInt4")
_FLOAT8 = "QFLOAT8E4M3FN"


def _get(settings: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in settings:
        return settings[key]
    extra = settings.get("extra_options")
    if isinstance(extra, Mapping) and key in extra:
        return extra[key]
    for path, value in settings.items():
        if isinstance(path, str) and path.rsplit(".", 1)[-1] == key:
            return value
    return DEFAULTS.get(key, default)


def _types(settings: Mapping[str, Any]) -> tuple[str, str]:
    return str(_get(settings, "activation_type")), str(_get(settings, "weight_type"))


def _qoperator_with(settings: Mapping[str, Any], kinds: Any) -> str | None:
    if _get(settings, "quant_format") != "QOperator":
        return None
    for t in _types(settings):
        if t in kinds:
            return f"QOperator format supports 8-bit types only; {t} needs quant_format QDQ"
    return None


def reject_qoperator_16bit(settings: Mapping[str, Any]) -> str | None:
    """QOperator format with a 16-bit type (``quantize_static`` refuses: QDQ only)."""
    return _qoperator_with(settings, _SIXTEEN)


def reject_qoperator_4bit(settings: Mapping[str, Any]) -> str | None:
    """QOperator format with a 4-bit type (the QOperator quantizer cannot pack 4-bit values)."""
    return _qoperator_with(settings, _FOUR)


def reject_qoperator_float8(settings: Mapping[str, Any]) -> str | None:
    """QOperator with float8 (the model references an op that does not exist)."""
    if _get(settings, "quant_format") == "QOperator" and _FLOAT8 in _types(settings):
        return f"QOperator format does not support {_FLOAT8}; use quant_format QDQ"
    return None


def reject_int8_activation_uint8_weight(settings: Mapping[str, Any]) -> str | None:
    """QInt8 activations with QUInt8 weights (``quantize_static`` refuses)."""
    if _types(settings) == ("QInt8", "QUInt8"):
        return "activation_type QInt8 with weight_type QUInt8 is not supported by ONNX Runtime"
    return None


def reject_dynamic_weight_type(settings: Mapping[str, Any]) -> str | None:
    """Dynamic quantization with weights other than 8 bits (MatMulInteger is 8-bit only)."""
    weight = _get(settings, "weight_type", DEFAULTS["weight_type"])
    if _get(settings, "quant_mode") == "dynamic" and weight not in ("QInt8", "QUInt8"):
        return f"quant_mode dynamic supports weight_type QInt8 or QUInt8 only, got {weight}"
    return None


def reject_float8_mixed(settings: Mapping[str, Any]) -> str | None:
    """Float8 on one side only (``quantize_static`` needs float8 for both or neither)."""
    activation, weight = _types(settings)
    if (activation == _FLOAT8) != (weight == _FLOAT8):
        return (
            f"{_FLOAT8} must be both activation_type and weight_type "
            f"(got activation {activation}, weight {weight})"
        )
    return None


def reject_float8_without_distribution(settings: Mapping[str, Any]) -> str | None:
    """Float8 with a calibration method other than Distribution (``quantize_static`` refuses)."""
    method = _get(settings, "calibrate_method")
    if _FLOAT8 in _types(settings) and method != "Distribution":
        return f"{_FLOAT8} needs calibrate_method Distribution, got {method}"
    return None


def reject_entropy_quantized_bins_over_bins(settings: Mapping[str, Any]) -> str | None:
    """Entropy with ``num_quantized_bins`` above ``num_bins`` (no threshold to search)."""
    if _get(settings, "calibrate_method") != "Entropy":
        return None
    bins = _get(settings, "num_bins", 128)
    quantized = _get(settings, "num_quantized_bins", 128)
    if quantized > bins:
        return f"Entropy needs num_quantized_bins <= num_bins, got {quantized} > {bins}"
    return None


def reject_distribution_few_bins(settings: Mapping[str, Any]) -> str | None:
    """Distribution with fewer than 512 bins (ONNX Runtime's calibrator refuses)."""
    if _get(settings, "calibrate_method") != "Distribution":
        return None
    bins = _get(settings, "num_bins", 2048)
    if bins < 512:
        return f"Distribution needs num_bins >= 512, got {bins}"
    return None


#: Every refusal rule, in the order :func:`reject_reason` applies them.
REJECT_RULES: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    reject_dynamic_weight_type,
    reject_int8_activation_uint8_weight,
    reject_float8_mixed,
    reject_float8_without_distribution,
    reject_qoperator_16bit,
    reject_qoperator_4bit,
    reject_qoperator_float8,
    reject_entropy_quantized_bins_over_bins,
    reject_distribution_few_bins,
)


def reject_reason(settings: Mapping[str, Any]) -> str | None:
    """The first reason ONNX Runtime would refuse ``settings``, or None."""
    if _get(settings, "quant_mode") == "dynamic":
        # The other rules are about static settings, which dynamic quantization ignores.
        return reject_dynamic_weight_type(settings)
    for rule in REJECT_RULES:
        reason = rule(settings)
        if reason:
            return reason
    return None
