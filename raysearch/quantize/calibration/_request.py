"""What calibration collects: :class:`CalibrationRequest`, its collection fields read only from
the settings the catalogue flags ``affects_calibration``; the others apply to collected
statistics and never cause inference.

Example:
    >>> request = CalibrationRequest.from_settings({"calibrate_method": "Entropy"})
    >>> request.collection_key()
    ('hist', 'value', 128)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from raysearch.space.catalogue import Catalogue, get_catalogue

__all__ = [
    "CalibrationRequest",
    "DEFAULT_OP_TYPES",
    "HISTOGRAM_METHODS",
    "calibration_catalogue",
    "calibration_values",
    "tensors_to_calibrate",
]

#: The op types ``quantize_static`` quantizes (and calibrates) when none are given.
DEFAULT_OP_TYPES: tuple[str, ...] = tuple(sorted(set(QLinearOpsRegistry) | set(QDQRegistry)))
HISTOGRAM_METHODS = ("Entropy", "Percentile", "Distribution")
#: ``create_calibrator``'s defaults, per method.
_DEFAULT_BINS = {"Entropy": 128, "Percentile": 2048, "Distribution": 2048}
_DEFAULT_QUANTIZED_BINS = 128
_DEFAULT_PERCENTILE = 99.999


def calibration_catalogue(backend: str | None = None) -> Catalogue:
    """The catalogue whose ``affects_calibration`` flags key ``backend``'s calibration."""
    catalogue = get_catalogue(backend)  # ``import raysearch`` registered the built-in ones
    if catalogue is None:
        raise ValueError(f"no settings catalogue is registered for backend {backend!r}")
    return catalogue


def calibration_values(
    settings: Mapping[str, Any], catalogue: Catalogue | None = None
) -> dict[str, Any]:
    """The values of ``settings`` that change calibration, by setting name.

    Example:
        >>> calibration_values({"per_channel": True, "calibrate_method": "MinMax"})
        {'calibrate_method': 'MinMax'}
    """
    catalogue = catalogue or calibration_catalogue()
    values: dict[str, Any] = {}
    for container, name in catalogue.calibration_keys():
        table = settings.get(container) if container else settings
        if isinstance(table, Mapping) and table.get(name) is not None:
            values[name] = table[name]
    return values


@dataclass(frozen=True)
class CalibrationRequest:
    """The settings that decide calibration (``op_types`` None: every op type ONNX Runtime
    quantizes; ``max_intermediate_outputs`` only bounds memory).
    """

    method: str = "MinMax"
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    symmetric: bool | None = None
    moving_average: bool = False
    averaging_constant: float = 0.01
    percentile: float = _DEFAULT_PERCENTILE
    num_bins: int | None = None
    num_quantized_bins: int = _DEFAULT_QUANTIZED_BINS
    scenario: str = "same"
    strided: int | None = None
    max_intermediate_outputs: int | None = None

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any], catalogue: Catalogue | None = None
    ) -> CalibrationRequest:
        """Read the collection fields from the calibration keys, the rest from ``extra_options``."""
        collected = calibration_values(settings, catalogue)
        extra = dict(settings.get("extra_options") or {})
        method = collected.get("calibrate_method") or "MinMax"
        if method not in ("MinMax", *HISTOGRAM_METHODS):
            raise ValueError(f"unknown calibrate_method {method!r}")
        op_types = collected.get("op_types_to_quantize") or DEFAULT_OP_TYPES
        symmetric = collected.get("CalibTensorRangeSymmetric")
        strided = collected.get("CalibStridedMinMax")
        bins = collected.get("num_bins")
        most = extra.get("CalibMaxIntermediateOutputs")
        return cls(
            method=method,
            op_types=tuple(sorted(set(op_types))),
            symmetric=None if symmetric is None else bool(symmetric),
            moving_average=bool(collected.get("CalibMovingAverage", False)),
            averaging_constant=float(collected.get("CalibMovingAverageConstant", 0.01)),
            percentile=float(extra.get("CalibPercentile", _DEFAULT_PERCENTILE)),
            num_bins=None if bins is None else int(bins),
            num_quantized_bins=int(extra.get("num_quantized_bins", _DEFAULT_QUANTIZED_BINS)),
            scenario=str(extra.get("scenario", "same")),
            strided=int(strided) if strided else None,
            max_intermediate_outputs=int(most) if most else None,
        )

    @property
    def bins(self) -> int:
        """The histogram's bin count (``num_bins`` or the method's default)."""
        return self.num_bins if self.num_bins is not None else _DEFAULT_BINS.get(self.method, 0)

    @property
    def is_symmetric(self) -> bool:
        default = self.method == "Percentile"
        return default if self.symmetric is None else self.symmetric

    @property
    def histogram_kind(self) -> str | None:
        """``"abs"`` (symmetric Percentile), ``"value"`` (other histogram methods) or None."""
        if self.method not in HISTOGRAM_METHODS:
            return None
        return "abs" if self.method == "Percentile" and self.is_symmetric else "value"

    def collection_key(self) -> tuple[Any, ...]:
        """What the collected statistics depend on, beyond model, data and tensors."""
        if self.method == "MinMax":
            average = self.averaging_constant if self.moving_average else None
            # ONNX Runtime symmetrises per stride before merging strides.
            symmetric = self.is_symmetric if self.strided else None
            return ("minmax", self.moving_average, average, self.strided, symmetric)
        return ("hist", self.histogram_kind, self.bins)

    def compute_params(self) -> tuple[Any, ...]:
        """The parameters that turn a collected histogram into ranges for this method."""
        if self.method == "Percentile":
            return (self.percentile,)
        if self.method == "Entropy":
            return (self.num_quantized_bins,)
        return (self.scenario,)


def tensors_to_calibrate(model: onnx.ModelProto, op_types: Sequence[str] | None) -> list[str]:
    """The tensors ONNX Runtime calibrates for ``op_types`` (``select_tensors_to_calibrate``)."""
    value_infos = {vi.name: vi for vi in model.graph.value_info}
    value_infos.update({o.name: o for o in model.graph.output})
    value_infos.update({i.name: i for i in model.graph.input})
    initializers = {init.name for init in model.graph.initializer}
    wanted = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    found: set[str] = set()
    for node in model.graph.node:
        if op_types and node.op_type not in op_types:
            continue
        for name in (*node.input, *node.output):
            vi = value_infos.get(name)
            if (
                vi is not None
                and vi.type.HasField("tensor_type")
                and vi.type.tensor_type.elem_type in wanted
                and name not in initializers
            ):
                found.add(name)
    return sorted(found)
