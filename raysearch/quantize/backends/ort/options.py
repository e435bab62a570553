"""The ONNX Runtime backend's settings catalogue.

Every key the ``ort`` backend takes is described here once: its type, its allowed values, and
whether it changes what calibration collects (the calibration cache key), so that an unknown
key or value is a config error, never a silent no-op inside ONNX Runtime. Pure data.

Example:
    >>> ORT_CATALOGUE.spec("", "calibrate_method").choices
    ('MinMax', 'Entropy', 'Percentile', 'Distribution')
    >>> ORT_CATALOGUE.canonical("extra_options", "Percentile")
    'CalibPercentile'
"""

from __future__ import annotations

from raysearch.quantize.backends.ort._rules import DEFAULTS
from raysearch.space.catalogue import (
    QUANTIZER,
    Catalogue,
    OptionSpec,
    register_catalogue,
)

__all__ = [
    "ORT_CATALOGUE",
    "DEFAULTS",
    "SETTINGS",
    "EXTRA_OPTIONS",
    "ALIASES",
    "QUANT_TYPES",
    "CALIBRATION_METHODS",
]

QUANT_TYPES = ("QInt8", "QUInt8", "QInt16", "QUInt16", "QInt4", "QUInt4", "QFLOAT8E4M3FN")
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


def _bool(doc: str, calib: bool = False) -> OptionSpec:
    return OptionSpec("bool", doc, affects_calibration=calib)


#: Top-level settings of the ONNX Runtime static quantizer (``quantize_static`` arguments).
SETTINGS: dict[str, OptionSpec] = {
    "quantizer": QUANTIZER,
    "quant_format": OptionSpec("enum", "QDQ or QOperator graph format", ("QDQ", "QOperator")),
    "quant_mode": OptionSpec(
        "enum",
        "static (calibrated activation ranges, quantize_static) or dynamic (ranges computed "
        "at run time, quantize_dynamic: no calibration)",
        ("static", "dynamic"),
    ),
    "calibrate_method": OptionSpec(
        "enum", "calibration method", CALIBRATION_METHODS, affects_calibration=True
    ),
    "activation_type": OptionSpec("enum", "activation quantization type", QUANT_TYPES),
    "weight_type": OptionSpec("enum", "weight quantization type", QUANT_TYPES),
    "per_channel": _bool("quantize weights per output channel"),
    "reduce_range": _bool("quantize weights with 7 bits (for old x86 VNNI-less CPUs)"),
    "op_types_to_quantize": OptionSpec(
        "str_list",
        "op types to quantize; null = every op type ONNX Runtime can quantize",
        nullable=True,
        affects_calibration=True,
    ),
    "nodes_to_exclude": OptionSpec("str_list", "node names kept in float", nullable=True),
    "nodes_to_quantize": OptionSpec(
        "str_list", "only these node names are quantized; null = all", nullable=True
    ),
    "extra_options": OptionSpec("dict", "ONNX Runtime extra_options (see EXTRA_OPTIONS)"),
}

#: ``extra_options`` keys: ``quantize_static``'s own plus the calibrator's lower-case options.
EXTRA_OPTIONS: dict[str, OptionSpec] = {
    "ActivationSymmetric": _bool("symmetric activation ranges"),
    "ActivationRestrictedAsymmetric": _bool("uint8 activations: snap the zero point"),
    "WeightSymmetric": _bool("symmetric weight ranges (ONNX Runtime default: true)"),
    "EnableSubgraph": _bool("quantize subgraphs"),
    "ForceQuantizeNoInputCheck": _bool("quantize latent ops even when their input is float"),
    "MatMulConstBOnly": _bool("quantize only MatMul with a constant B"),
    "AddQDQPairToWeight": _bool("keep float weights with a QDQ pair"),
    "OpTypesToExcludeOutputQuantization": OptionSpec(
        "str_list", "op types whose outputs stay float"
    ),
    "DedicatedQDQPair": _bool("one QDQ pair per consumer"),
    "QDQOpTypePerChannelSupportToAxis": OptionSpec("dict", "per-channel axis per op type"),
    "QDQKeepRemovableActivations": _bool("keep Relu/Clip in the QDQ graph"),
    "QDQDisableWeightAdjustForInt32Bias": _bool("do not adjust weight scales for int32 bias"),
    "UseQDQContribOps": _bool("use com.microsoft Q/DQ ops"),
    "QuantizeBias": _bool("quantize biases to int32 (default true; false keeps them float)"),
    "MinimumRealRange": OptionSpec("float", "minimum rmax - rmin", low=0.0),
    "TensorQuantOverrides": OptionSpec("dict", "per-tensor overrides"),
    "CalibTensorRangeSymmetric": _bool("symmetric calibrated ranges", calib=True),
    "CalibMovingAverage": _bool("MinMax: moving average of min and max", calib=True),
    "CalibMovingAverageConstant": OptionSpec(
        "float", "moving-average smoothing constant", low=0.0, high=1.0, affects_calibration=True
    ),
    # ONNX Runtime merges per-stride ranges: strides change what calibration collects.
    "CalibStridedMinMax": OptionSpec(
        "int", "MinMax: samples per stride", low=1, affects_calibration=True
    ),
    "CalibMaxIntermediateOutputs": OptionSpec("int", "outputs held before merging", low=1),
    # Applied to an existing histogram: changes the ranges, not what calibration collects.
    "CalibPercentile": OptionSpec("float", "Percentile method: percentile", low=0.0, high=100.0),
    "num_bins": OptionSpec(
        "int", "histogram bins (Entropy, Percentile, Distribution)", low=1, affects_calibration=True
    ),
    "num_quantized_bins": OptionSpec("int", "Entropy: quantized bins", low=1),
    "scenario": OptionSpec("enum", "Distribution scenario", ("same", "p3")),
}

#: Accepted spellings -> canonical names, per container ("" = top level).
ALIASES: dict[str, dict[str, str]] = {
    "": {"calibration_method": "calibrate_method", "quant_type": "activation_type"},
    "extra_options": {
        "Percentile": "CalibPercentile",
        "percentile": "CalibPercentile",
        "NumBins": "num_bins",
        "NumQuantizedBins": "num_quantized_bins",
    },
}


#: The ``ort`` backend's catalogue, registered for the space to validate against.
ORT_CATALOGUE = register_catalogue(
    Catalogue("ort", SETTINGS, {"extra_options": EXTRA_OPTIONS}, ALIASES)
)
