"""The catalogue of quantization settings raysearch understands.

Every key a search space may set is described here once: its type, its allowed values, and
whether it changes what calibration collects (which decides the calibration cache key). The
space validates choices against this catalogue, so an unknown key or value is a config error
found before anything runs, never a silent no-op inside ONNX Runtime.

Example:
    >>> from raysearch.quantize.options import SETTINGS, canonical_name
    >>> SETTINGS["calibrate_method"].choices
    ('MinMax', 'Entropy', 'Percentile', 'Distribution')
    >>> canonical_name("extra_options", "Percentile")
    'CalibPercentile'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OptionSpec",
    "SETTINGS",
    "EXTRA_OPTIONS",
    "ALIASES",
    "QUANT_TYPES",
    "CALIBRATION_METHODS",
    "UNAVAILABLE",
    "canonical_name",
    "check_value",
    "unavailable_reason",
]

QUANT_TYPES = ("QInt8", "QUInt8", "QInt16", "QUInt16", "QInt4", "QUInt4", "QFLOAT8E4M3FN")
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


@dataclass(frozen=True)
class OptionSpec:
    """One setting: its kind (``enum``, ``bool``, ``int``, ``float``, ``str``, ``str_list``,
    ``dict``), allowed ``choices`` for enums, numeric bounds, and whether it changes calibration."""

    kind: str
    doc: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    nullable: bool = False
    affects_calibration: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def _bool(doc: str, calib: bool = False) -> OptionSpec:
    return OptionSpec("bool", doc, affects_calibration=calib)


#: Top-level settings of the ONNX Runtime static quantizer (``quantize_static`` arguments).
SETTINGS: dict[str, OptionSpec] = {
    "quantizer": OptionSpec("str", "quantizer backend registry key (default: ort)"),
    "quant_format": OptionSpec("enum", "QDQ or QOperator graph format", ("QDQ", "QOperator")),
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
    "MinimumRealRange": OptionSpec("float", "minimum rmax - rmin", low=0.0),
    "TensorQuantOverrides": OptionSpec("dict", "per-tensor overrides"),
    "CalibTensorRangeSymmetric": _bool("symmetric calibrated ranges", calib=True),
    "CalibMovingAverage": _bool("MinMax: moving average of min and max", calib=True),
    "CalibMovingAverageConstant": OptionSpec(
        "float", "moving-average smoothing constant", low=0.0, high=1.0, affects_calibration=True
    ),
    "CalibStridedMinMax": OptionSpec("int", "MinMax: samples per stride", low=1),
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


_FINETUNE = (
    "fine-tuning (AdaRound/AdaQuant) is not available in raysearch yet; remove this key "
    "(it would otherwise be accepted and do nothing)"
)
_SMOOTHQUANT = (
    "SmoothQuant is not available in raysearch yet (ONNX Runtime's needs neural-compressor "
    "2.x, which raysearch does not install); remove this key"
)

#: Names of techniques raysearch does not have yet (Quark's and ONNX Runtime's spellings),
#: in any container, with why they are refused. Refusing them is the point: a setting is
#: never accepted and then silently dropped.
UNAVAILABLE: dict[str, str] = {
    **dict.fromkeys(
        (
            "include_fast_ft",
            "FastFinetune",
            "NumIterLR",
            "NumIterations",
            "LearningRate",
            "OptimAlgorithm",
            "OptimDevice",
            "InferDevice",
            "DataSize",
            "FixedSeed",
            "algorithm",
            "finetune",
            "num_iterations",
            "learning_rate",
        ),
        _FINETUNE,
    ),
    **dict.fromkeys(
        ("include_sq", "SmoothQuant", "SmoothQuantAlpha", "SmoothQuantFolding", "SmoothAlpha"),
        _SMOOTHQUANT,
    ),
    "include_cle": "cross-layer equalization (CLE) is not available in raysearch yet; remove "
    "this key",
    "include_auto_mp": "auto mixed precision is not available in raysearch yet; remove this key",
}


def unavailable_reason(key: str) -> str | None:
    """Why ``key`` names a technique raysearch refuses for now, or None.

    Example:
        >>> unavailable_reason("NumIterLR").split(";")[0]
        'fine-tuning (AdaRound/AdaQuant) is not available in raysearch yet'
        >>> unavailable_reason("per_channel") is None
        True
    """
    return UNAVAILABLE.get(key)


def canonical_name(container: str, key: str) -> str:
    """Return the canonical name of ``key`` inside ``container`` ("" or "extra_options")."""
    return ALIASES.get(container, {}).get(key, key)


def check_value(spec: OptionSpec, value: Any) -> str | None:
    """Return why ``value`` is not valid for ``spec``, or None when it is."""
    if value is None:
        return None if spec.nullable else "null is not allowed here"
    kind = spec.kind
    if kind == "enum":
        if value not in spec.choices:
            return f"expected one of {', '.join(map(str, spec.choices))}, got {value!r}"
        return None
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if kind == "str":
        return None if isinstance(value, str) else f"expected a string, got {value!r}"
    if kind == "dict":
        return None if isinstance(value, dict) else f"expected a mapping, got {value!r}"
    if kind == "str_list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"expected a list of names, got {value!r}"
        return None
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {value!r}"
        if kind == "int" and not float(value).is_integer():
            return f"expected an integer, got {value!r}"
        if spec.low is not None and value < spec.low:
            return f"expected a value >= {spec.low}, got {value!r}"
        if spec.high is not None and value > spec.high:
            return f"expected a value <= {spec.high}, got {value!r}"
        return None
    raise AssertionError(f"unknown option kind {kind}")
