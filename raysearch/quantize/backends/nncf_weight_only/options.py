"""The ``nncf_weight_only`` backend's settings catalogue and the combinations it refuses.

``quantizer: nncf_weight_only`` is NNCF 3.4's ``nncf.compress_weights`` on the ONNX model
(4-bit ``MatMulNBits``, 8-bit per-channel ``DequantizeLinear``, float activations). Each key
is one ``compress_weights`` argument as NNCF names it (:data:`SETTINGS`; ``nodes_float`` is
its ``ignored_scope``); what NNCF or ONNX Runtime cannot do is refused by
:func:`reject_reason`. Not offered: float and codebook modes, ``gptq``/``lora_correction``,
``group_size: -1`` at 4 bits, ``compression_format`` and ``subset_size``. Imports neither
NNCF nor ONNX Runtime.

Example:
    >>> NNCF_WEIGHT_ONLY_CATALOGUE.spec("", "mode").choices
    ('int4_sym', 'int4_asym', 'int8_sym', 'int8_asym')
    >>> reject_reason({"mode": "int4_sym", "group_size": 48})
    'group_size 48: MatMulNBits needs a power of two from 16 to 256'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raysearch.quantize.registry import first_refusal
from raysearch.space.catalogue import QUANTIZER, Catalogue, OptionSpec, register_catalogue
from raysearch.space.rules import FOUR_BIT_ONLY  # the keys NNCF takes with a 4-bit mode only

__all__ = [
    "NNCF_WEIGHT_ONLY_CATALOGUE",
    "SETTINGS",
    "MODES",
    "INT8_MODES",
    "SENSITIVITY_METRICS",
    "DEFAULT_MODE",
    "DEFAULT_GROUP_SIZE",
    "REJECT_RULES",
    "reject_reason",
    "is_data_aware",
    "mode",
]

MODES = ("int4_sym", "int4_asym", "int8_sym", "int8_asym")
INT8_MODES = ("int8_sym", "int8_asym")
#: NNCF's default ``mode`` and the ``group_size`` of its 4-bit modes.
DEFAULT_MODE = "int8_asym"
DEFAULT_GROUP_SIZE = 128
#: ``nncf.SensitivityMetric`` values; every one but the first reads the calibration data.
SENSITIVITY_METRICS = (
    "weight_quantization_error",
    "hessian_input_activation",
    "mean_activation_variance",
    "max_activation_variance",
    "mean_activation_magnitude",
)
SETTINGS: dict[str, OptionSpec] = {
    "quantizer": QUANTIZER,
    "mode": OptionSpec("enum", "4-bit MatMulNBits with an 8-bit backup, or 8 bits", MODES),
    "group_size": OptionSpec("int", "weights per scale of the 4-bit layers", low=16, high=256),
    "ratio": OptionSpec("float", "share of the ratio-defining layers at 4 bits", low=0.0, high=1.0),
    "sensitivity_metric": OptionSpec(
        "enum", "how the layers ratio keeps at 4 bits are chosen", SENSITIVITY_METRICS
    ),
    "backup_mode": OptionSpec(
        "enum", "precision of the layers not at 4 bits", ("int8_asym", "int8_sym", "none")
    ),
    "all_layers": OptionSpec("bool", "the last MatMul at 4 bits and in the ratio too"),
    "quantize_embeddings": OptionSpec("bool", "embedding Gathers compressed, or kept float"),
    "awq": OptionSpec("bool", "NNCF's AWQ on the calibration data"),
    "scale_estimation": OptionSpec("bool", "NNCF's scale estimation on the calibration data"),
    "group_size_fallback_mode": OptionSpec(
        "enum",
        "a weight group_size does not divide: error, ignore (float) or adjust",
        ("error", "ignore", "adjust"),
    ),
    "nodes_float": OptionSpec("str_list", "weight MatMul or embedding Gather names kept float"),
    "gptq": OptionSpec("bool", "refused: NNCF runs no GPTQ on ONNX models"),
    "lora_correction": OptionSpec("bool", "refused: NNCF runs no LoRA correction on ONNX"),
}

#: The ``nncf_weight_only`` backend's catalogue, registered for the space to validate against.
NNCF_WEIGHT_ONLY_CATALOGUE = register_catalogue(Catalogue("nncf_weight_only", SETTINGS))


def mode(settings: Mapping[str, Any]) -> str:
    """The settings' ``mode``, NNCF's default where unset."""
    return str(settings.get("mode") or DEFAULT_MODE)


def is_data_aware(settings: Mapping[str, Any]) -> bool:
    """Whether ``settings`` need calibration data (AWQ, scale estimation, an activation metric).

    Example:
        >>> is_data_aware({"mode": "int4_sym", "ratio": 0.8})
        False
    """
    if settings.get("awq") or settings.get("scale_estimation"):
        return True
    metric = settings.get("sensitivity_metric")
    ratio = settings.get("ratio")
    return metric not in (None, "weight_quantization_error") and ratio is not None and ratio < 1


def _reject_unsupported(settings: Mapping[str, Any]) -> str | None:
    for key in ("gptq", "lora_correction"):
        if settings.get(key):
            return (
                f"{key} is refused: NNCF 3.4's compress_weights runs it on OpenVINO and PyTorch "
                "models only, not on ONNX"
            )
    return None


def _reject_int8(settings: Mapping[str, Any]) -> str | None:
    chosen = mode(settings)
    if chosen not in INT8_MODES:
        return None
    given = [k for k in FOUR_BIT_ONLY if settings.get(k) is not None]
    if not given:
        return None
    return (
        f"mode {chosen} compresses every weight per output channel at 8 bits: "
        f"{', '.join(given)} apply to the 4-bit modes only (NNCF refuses them)"
    )


def _reject_group_size(settings: Mapping[str, Any]) -> str | None:
    group = settings.get("group_size")
    if group is None:
        return None
    group = int(group)
    if group < 16 or group > 256 or group & (group - 1):
        return f"group_size {group}: MatMulNBits needs a power of two from 16 to 256"
    return None


def _reject_all_layers(settings: Mapping[str, Any]) -> str | None:
    if not settings.get("all_layers") or settings.get("quantize_embeddings") is False:
        return None
    return (
        "all_layers needs quantize_embeddings: false: NNCF 3.4 writes a 4-bit embedding Gather "
        "as a MatMulNBits reading the int64 token ids, which ONNX Runtime refuses"
    )


def _reject_idle_metric(settings: Mapping[str, Any]) -> str | None:
    if settings.get("sensitivity_metric") is None or mode(settings) in INT8_MODES:
        return None
    ratio = settings.get("ratio")
    if ratio is None or ratio >= 1:
        return (
            "sensitivity_metric chooses the layers ratio keeps at 4 bits: with ratio 1 (every "
            "one at 4 bits) it changes nothing; set ratio below 1"
        )
    return None


#: Every refusal, in the order :func:`reject_reason` applies them.
REJECT_RULES: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    _reject_unsupported,
    _reject_int8,
    _reject_group_size,
    _reject_all_layers,
    _reject_idle_metric,
)


def reject_reason(settings: Mapping[str, Any]) -> str | None:
    """The first refusal of ``settings`` (one line), or None."""
    return first_refusal(REJECT_RULES, settings)
