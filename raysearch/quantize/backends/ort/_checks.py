"""The ``ort`` backend's settings checked against a model (enum values, op types, node names),
each failure a ConfigError naming the closest valid value.

Example:
    >>> enum_value({"quant_format": "QDQ"}, "quant_format", QuantFormat)
    <QuantFormat.QDQ: 1>
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

from raysearch.errors import ConfigError, suggest
from raysearch.modelfile import graph_nodes, load_header
from raysearch.quantize.backends.ort._rules import DEFAULTS
from raysearch.quantize.calibration import DEFAULT_OP_TYPES

__all__ = ["ENUMS", "enum_value", "check_settings"]

# The backend module's logger: users configure "raysearch.quantize.backends.ort._backend".
_logger = logging.getLogger("raysearch.quantize.backends.ort._backend")


def check_settings(settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto) -> None:
    """Refuse values ONNX Runtime does not know, unknown op types and unknown node names."""
    for key, enum in ENUMS.items():
        enum_value(settings, key, enum)
    op_types, node_names = _model_names(model)
    requested = settings.get("op_types_to_quantize")
    if requested:
        _check_op_types(list(requested), op_types)
    elif "op_types_to_quantize" in settings:  # null: every op type ONNX Runtime quantizes
        _check_something_to_quantize(model, op_types)
    for key in ("nodes_to_quantize", "nodes_to_exclude"):
        names = settings.get(key)
        if names:
            _check_node_names(key, list(names), node_names)


ENUMS: dict[str, Any] = {
    "quant_format": QuantFormat,
    "calibrate_method": CalibrationMethod,
    "activation_type": QuantType,
    "weight_type": QuantType,
}


def enum_value(settings: Mapping[str, Any], key: str, enum: Any) -> Any:
    """The enum member ``settings[key]`` names (default: quantize_static's), or a ConfigError."""
    value = settings.get(key) or DEFAULTS[key]
    if value not in enum.__members__:
        names = list(enum.__members__)
        raise ConfigError(
            key,
            f"unknown value {value!r}"
            + suggest(str(value), names)
            + f"; expected one of {', '.join(names)}",
        )
    return enum[value]


@functools.lru_cache(maxsize=8)
def _names_of_file(path: str, mtime_ns: int, size: int) -> tuple[frozenset[str], frozenset[str]]:
    return _names_of_proto(load_header(path))


def _names_of_proto(model: onnx.ModelProto) -> tuple[frozenset[str], frozenset[str]]:
    nodes = list(graph_nodes(model.graph))
    return frozenset(n.op_type for n in nodes), frozenset(n.name for n in nodes if n.name)


def _model_names(
    model: str | os.PathLike | onnx.ModelProto,
) -> tuple[frozenset[str], frozenset[str]]:
    """(op types, node names) of ``model``, subgraphs included."""
    if isinstance(model, onnx.ModelProto):
        return _names_of_proto(model)
    path = os.path.realpath(os.fspath(model))
    st = os.stat(path)
    return _names_of_file(path, st.st_mtime_ns, st.st_size)


def _check_something_to_quantize(
    model: str | os.PathLike | onnx.ModelProto, in_model: frozenset[str]
) -> None:
    if not in_model & set(DEFAULT_OP_TYPES):
        name = "the model" if isinstance(model, onnx.ModelProto) else os.path.basename(model)
        raise ConfigError(
            "model",
            f"{name} has no op ONNX Runtime can quantize (its op types: "
            f"{', '.join(sorted(in_model))})",
        )


def _is_onnx_op(op_type: str) -> bool:
    return any(onnx.defs.has(op_type, domain) for domain in ("", "ai.onnx.ml", "com.microsoft"))


def _check_op_types(requested: list[str], in_model: frozenset[str]) -> None:
    unknown = [op for op in requested if op not in in_model and not _is_onnx_op(op)]
    if unknown:
        pool = sorted(in_model) + sorted(set(DEFAULT_OP_TYPES) - in_model)
        described = ", ".join(f"'{op}'{suggest(op, pool)}" for op in unknown)
        noun = "op type" if len(unknown) == 1 else "op types"
        raise ConfigError("op_types_to_quantize", f"unknown {noun} {described}")
    present = [op for op in requested if op in in_model]
    if not present:
        raise ConfigError(
            "op_types_to_quantize",
            f"none of {', '.join(requested)} occurs in the model, so nothing would be "
            f"quantized; the model's op types are {', '.join(sorted(in_model))}",
        )
    absent = [op for op in requested if op not in in_model]
    if absent:
        _logger.debug("op types not in the model (ignored): %s", ", ".join(absent))


def _check_node_names(key: str, requested: list[str], in_model: frozenset[str]) -> None:
    unknown = [name for name in requested if name not in in_model]
    if unknown:
        pool = sorted(in_model)
        described = ", ".join(f"'{name}'{suggest(name, pool)}" for name in unknown)
        noun = "node" if len(unknown) == 1 else "nodes"
        raise ConfigError(key, f"unknown {noun} {described}; the model has no node of that name")
