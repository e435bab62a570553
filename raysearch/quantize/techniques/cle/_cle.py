"""Cross-layer equalization (Nagel et al. 2019): balance per-channel weight ranges of
consecutive layers.

A head's output channel ``i`` that feeds a tail's input channel ``i`` through ops commuting
with a positive scale (Relu, LeakyRelu, Clip(0, inf), pools; never Clip(0, 6)) is divided by
``s_i = sqrt(r1_i / r2_i)`` and the tail's multiplied by it, so both ranges become
``sqrt(r1_i * r2_i)`` and the float function is unchanged. Pairs: Conv -> Conv and
Gemm/MatMul -> Gemm/MatMul with constant weights, in graph order.

Settings (Quark's, in ``extra_options``, with ``include_cle``): ``CLESteps`` (1),
``CLEScaleAppendBias`` (True), ``CLEBalanceMethod`` (``max``/``avg``),
``CLEScaleUseThreshold`` (True) with ``CLEWeightThreshold`` (0.5), and
``CLETotalLayerDiffThreshold`` (2e-7).

Example:
    >>> equalization_scales(np.array([[4.0, -1.0]]), np.array([[1.0]]))
    array([2.])
    >>> equalization_scales(np.array([[0.1]]), np.array([[0.1]]), weight_threshold=0.5)
    array([1.])
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

from raysearch.modelfile import write_model
from raysearch.modelgraph import constants_to_initializers
from raysearch.quantize.technique import FloatModelTransform, register_technique
from raysearch.quantize.techniques.cle._graph import Layer, channel_last, find_pairs, weights_of
from raysearch.space.catalogue import OptionSpec

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["CrossLayerEqualization", "CLEOptions", "equalization_scales", "equalize_model"]

_logger = logging.getLogger(__name__)

SWITCH = "include_cle"
_CONTAINER = "extra_options"


@dataclass(frozen=True)
class CLEOptions:
    """The CLE parameters, defaults as in Quark."""

    steps: int = 1
    append_bias: bool = True
    balance_method: str = "max"
    use_threshold: bool = True
    weight_threshold: float = 0.5
    diff_threshold: float = 2e-7

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> CLEOptions:
        """The options in a trial's settings (``extra_options``), defaults filled in."""
        extra = settings.get(_CONTAINER) or {}
        default = cls()
        return cls(
            steps=int(extra.get("CLESteps", default.steps)),
            append_bias=bool(extra.get("CLEScaleAppendBias", default.append_bias)),
            balance_method=str(extra.get("CLEBalanceMethod", default.balance_method)),
            use_threshold=bool(extra.get("CLEScaleUseThreshold", default.use_threshold)),
            weight_threshold=float(extra.get("CLEWeightThreshold", default.weight_threshold)),
            diff_threshold=float(extra.get("CLETotalLayerDiffThreshold", default.diff_threshold)),
        )

    def key(self) -> str:
        """A string that differs exactly when the options change the result."""
        values: dict[str, Any] = {
            "steps": self.steps,
            "append_bias": self.append_bias,
            "balance_method": self.balance_method,
        }
        if self.use_threshold:
            values["weight_threshold"] = self.weight_threshold
        if self.steps > 1:
            values["diff_threshold"] = self.diff_threshold
        return json.dumps(values, sort_keys=True)


def channel_ranges(rows: np.ndarray, balance_method: str = "max") -> np.ndarray:
    """Each row's largest (``max``) or mean (``avg``) absolute value."""
    if balance_method == "max":
        return np.abs(rows).max(axis=1)
    if balance_method == "avg":
        return np.abs(rows).mean(axis=1)
    raise ValueError(f"CLEBalanceMethod must be 'max' or 'avg', got {balance_method!r}")


def equalization_scales(
    head_rows: np.ndarray,
    tail_rows: np.ndarray,
    *,
    balance_method: str = "max",
    weight_threshold: float | None = None,
) -> np.ndarray:
    """``s`` per channel so both ranges become ``sqrt(r1 * r2)``; 1 below ``weight_threshold``."""
    r1 = channel_ranges(head_rows, balance_method)
    r2 = channel_ranges(tail_rows, balance_method)
    usable = (r1 > 0) & (r2 > 0)
    if weight_threshold is not None:
        usable &= (r1 + r2) >= weight_threshold
    scales = np.ones_like(r1, dtype=np.float64)
    scales[usable] = np.sqrt(r1[usable] / r2[usable])
    return scales


def _equalize_pair(
    head: Layer, tail: Layer, arrays: dict[str, np.ndarray], options: CLEOptions
) -> None:
    w1, w2 = arrays[head.weight], arrays[tail.weight]
    rows = head.out_rows(w1)
    bias = None
    if head.bias is not None:
        bias = channel_last(arrays[head.bias], rows.shape[0])
        if options.append_bias:
            # The bias as further "weights" of its channel: [channels, bias values].
            rows = np.concatenate([rows, bias.reshape(-1, rows.shape[0]).T], axis=1)
    scales = equalization_scales(
        rows,
        tail.in_rows(w2),
        balance_method=options.balance_method,
        weight_threshold=options.weight_threshold if options.use_threshold else None,
    )
    arrays[head.weight] = head.scale_out(w1, 1.0 / scales)
    if bias is not None and head.bias is not None:
        arrays[head.bias] = bias / scales  # the channel axis is last
    arrays[tail.weight] = tail.scale_in(w2, scales)


def equalize_model(model: onnx.ModelProto, options: CLEOptions | None = None) -> dict[str, float]:
    """Equalize ``model``'s layer pairs in place; ``pairs`` and ``passes`` counts."""
    options = options or CLEOptions()
    if options.steps < 1:
        raise ValueError(f"CLESteps must be >= 1, got {options.steps}")
    pairs = find_pairs(model)
    if not pairs:
        _logger.info("CLE: no layer pair qualifies; the model is unchanged")
        return {"pairs": 0.0, "passes": 0.0}
    arrays = weights_of(model, pairs)
    passes = 0
    for _ in range(options.steps):
        before = dict(arrays)
        for head, tail in pairs:
            _equalize_pair(head, tail, arrays, options)
        passes += 1
        change = sum(float(np.mean(np.abs(arrays[n] - before[n]))) for n in arrays)
        _logger.debug("CLE pass %d: mean absolute weight change %.3g", passes, change)
        if change <= options.diff_threshold:
            break
    for tensor in model.graph.initializer:
        if tensor.name in arrays:
            dtype = numpy_helper.to_array(tensor).dtype
            tensor.CopyFrom(numpy_helper.from_array(arrays[tensor.name].astype(dtype), tensor.name))
    _logger.info("CLE: %d layer pairs equalized in %d passes", len(pairs), passes)
    return {"pairs": float(len(pairs)), "passes": float(passes)}


def _extra(kind: str, doc: str, **kwargs: Any) -> OptionSpec:
    return OptionSpec(kind, doc, requires=SWITCH, **kwargs)


@register_technique("cle")
class CrossLayerEqualization(FloatModelTransform):
    """Cross-layer equalization of the float model before calibration (see the module)."""

    settings: ClassVar[Mapping[str, OptionSpec]] = {
        SWITCH: OptionSpec("bool", "cross-layer equalization of the float model"),
    }
    containers: ClassVar[Mapping[str, Mapping[str, OptionSpec]]] = {
        _CONTAINER: {
            "CLESteps": _extra("int", "CLE: passes over all layer pairs (default 1)", low=1),
            "CLEScaleAppendBias": _extra(
                "bool", "CLE: the head layer's bias counts in its channel range (default True)"
            ),
            "CLEBalanceMethod": _extra(
                "enum", "CLE: channel range, max or mean absolute weight", choices=("max", "avg")
            ),
            "CLEScaleUseThreshold": _extra(
                "bool", "CLE: leave channels whose ranges sum below CLEWeightThreshold"
            ),
            "CLEWeightThreshold": _extra(
                "float", "CLE: range sum below which a channel is left (default 0.5)", low=0.0
            ),
            "CLETotalLayerDiffThreshold": _extra(
                "float", "CLE: stop passes once one changes the weights by at most this", low=0.0
            ),
        }
    }
    #: Before other float transforms: equalized weights are what they should see.
    order: ClassVar[int] = 10

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        if not settings.get(SWITCH):
            return None
        return CLEOptions.from_settings(settings).key()

    def transform(
        self,
        model_path: str,
        out_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        model = onnx.load(os.fspath(model_path))
        constants_to_initializers(model)  # weights held by Constant nodes count too
        equalize_model(model, CLEOptions.from_settings(settings))
        write_model(model, out_path)
