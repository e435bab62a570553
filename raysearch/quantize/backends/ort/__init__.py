"""The ONNX Runtime backend (``quantizer: ort``): ``quantize_static``/``quantize_dynamic`` with
raysearch's shared calibration, its settings catalogue and its refusals."""

from __future__ import annotations

from raysearch.quantize.backends.ort._backend import OrtBackend, split_extra_options
from raysearch.quantize.backends.ort._rules import (
    REJECT_RULES,
    reject_distribution_few_bins,
    reject_entropy_quantized_bins_over_bins,
    reject_float8_mixed,
    reject_float8_without_distribution,
    reject_int8_activation_uint8_weight,
    reject_qoperator_4bit,
    reject_qoperator_16bit,
    reject_qoperator_float8,
    reject_reason,
)

__all__ = [
    "OrtBackend",
    "split_extra_options",
    "REJECT_RULES",
    "reject_reason",
    "reject_qoperator_16bit",
    "reject_qoperator_4bit",
    "reject_qoperator_float8",
    "reject_int8_activation_uint8_weight",
    "reject_float8_mixed",
    "reject_float8_without_distribution",
    "reject_entropy_quantized_bins_over_bins",
    "reject_distribution_few_bins",
]
