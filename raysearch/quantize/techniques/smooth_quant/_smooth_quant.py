"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights before calibration.

For each MatMul / Gemm (optionally Conv, ``group=1``) with constant weight ``W`` and input
``X``: ``s_j = m_x[j]^a / m_w[j]^(1-a)`` (``m_x``, ``m_w``: the largest ``|X|``, ``|W|`` of
input channel ``j``; 1 where either is 0, clipped to [1e-5, 1e5]); ``W' = diag(s) W``,
``X' = X / s``. Consumers sharing ``X`` share one ``s``. ``1 / s`` is folded into the producer
of ``X`` where that changes nothing else, else a ``Mul`` is inserted.

Settings (``include_sq``; in ``extra_options``): ``SmoothAlpha`` (0.5), ``SmoothQuantAlphas``
(per op type), ``SmoothQuantOpTypes`` (MatMul, Gemm), ``SmoothQuantFolding`` (True).

Example:
    >>> smoothing_scales(np.array([4.0, 1.0]), np.array([1.0, 1.0]), 0.5).tolist()
    [2.0, 1.0]
    >>> options = smooth_options({"include_sq": True, "extra_options": {"SmoothAlpha": 0.7}})
    >>> options.alphas, options.folding
    ({'Gemm': 0.7, 'MatMul': 0.7}, True)
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
from onnx import helper

from raysearch.errors import ConfigError
from raysearch.modelfile import node_attribute, write_model
from raysearch.modelgraph import constants_to_initializers
from raysearch.providers import make_session
from raysearch.quantize.technique import FloatModelTransform, register_technique
from raysearch.quantize.techniques.smooth_quant._graph import Graph, shaped
from raysearch.space.catalogue import OptionSpec

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["SmoothQuant", "SmoothOptions", "smooth_options", "smoothing_scales", "smooth_model"]

_logger = logging.getLogger(__name__)

SWITCH = "include_sq"
OP_TYPES = ("MatMul", "Gemm", "Conv")
DEFAULT_OP_TYPES = ("MatMul", "Gemm")
DEFAULT_ALPHA = 0.5
#: The range ``s`` is clipped to (a channel that is all but silent would blow a weight up).
S_RANGE = (1e-5, 1e5)
#: Rounds of shape probing for fold chains through tensors of unknown shape.
_PROBE_ROUNDS = 4
_LARGE = 1 << 31


@dataclass(frozen=True)
class SmoothOptions:
    """What one trial's settings ask: ``alphas`` per smoothed op type, and ``folding``."""

    alphas: dict[str, float]
    folding: bool = True


def smooth_options(settings: Mapping[str, Any]) -> SmoothOptions | None:
    """The SmoothQuant options of ``settings``, None when off (ConfigError: a bad alpha
    or op type).
    """
    if not settings.get(SWITCH):
        return None
    extra = settings.get("extra_options") or {}
    alpha = _alpha(extra.get("SmoothAlpha", DEFAULT_ALPHA), "extra_options.SmoothAlpha")
    ops = extra.get("SmoothQuantOpTypes")
    ops = list(DEFAULT_OP_TYPES) if ops is None else [str(op) for op in ops]
    for op in ops:
        if op not in OP_TYPES:
            raise ConfigError(
                "extra_options.SmoothQuantOpTypes", f"expected {', '.join(OP_TYPES)}, got {op!r}"
            )
    per_type = extra.get("SmoothQuantAlphas") or {}
    for op in per_type:
        if op not in OP_TYPES:
            raise ConfigError(
                "extra_options.SmoothQuantAlphas", f"expected {', '.join(OP_TYPES)}, got {op!r}"
            )
    if not ops:
        return None
    alphas = {
        op: _alpha(per_type.get(op, alpha), f"extra_options.SmoothQuantAlphas.{op}")
        for op in sorted(set(ops))
    }
    return SmoothOptions(alphas, bool(extra.get("SmoothQuantFolding", True)))


def _alpha(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(path, f"expected a number in [0, 1], got {value!r}")
    return float(value)


def smoothing_scales(m_x: np.ndarray, m_w: np.ndarray, alpha: float) -> np.ndarray:
    """``s = m_x^alpha / m_w^(1 - alpha)``; 1 where either is 0, clipped to :data:`S_RANGE`."""
    m_x = np.asarray(m_x, np.float64)
    m_w = np.asarray(m_w, np.float64)
    ok = (m_x > 0) & (m_w > 0) & np.isfinite(m_x) & np.isfinite(m_w)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.where(ok, np.power(m_x, alpha) / np.power(m_w, 1.0 - alpha), 1.0)
    return np.clip(np.where(np.isfinite(s), s, 1.0), *S_RANGE)


@dataclass
class _Group:
    """Consumers sharing one activation ``tensor`` (channel ``axis``, ``size`` channels)."""

    tensor: str
    axis: int
    size: int
    alpha: float
    consumers: list[onnx.NodeProto] = field(default_factory=list)
    m_w: np.ndarray | None = None
    dtype: np.dtype = np.dtype(np.float32)


def _consumer(graph: Graph, node: onnx.NodeProto) -> tuple[int, int, np.ndarray] | None:
    """``(axis, channels, per-channel |W| max)`` of a node SmoothQuant can smooth."""
    weight = graph.const(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.dtype.type not in (np.float16, np.float32, np.float64):
        return None
    if graph.const(node.input[0]) is not None:
        return None
    magnitude = np.abs(weight.astype(np.float64))
    if node.op_type == "MatMul" and weight.ndim == 2:
        return -1, weight.shape[0], magnitude.max(axis=1)
    if node.op_type == "Gemm" and weight.ndim == 2 and not node_attribute(node, "transA", 0):
        if node_attribute(node, "transB", 0):
            return -1, weight.shape[1], magnitude.max(axis=0)
        return -1, weight.shape[0], magnitude.max(axis=1)
    if node.op_type == "Conv" and weight.ndim >= 3 and node_attribute(node, "group", 1) == 1:
        others = tuple(i for i in range(weight.ndim) if i != 1)
        return -(weight.ndim - 1), weight.shape[1], magnitude.max(axis=others)
    return None


def _weight_factor(node: onnx.NodeProto, weight_ndim: int, s: np.ndarray) -> np.ndarray:
    """``s`` shaped to scale the input channels of ``node``'s weight."""
    if node.op_type == "Conv":
        return s.reshape([1, s.size] + [1] * (weight_ndim - 2))
    if node.op_type == "Gemm" and node_attribute(node, "transB", 0):
        return s[None, :]
    return s[:, None]


def _groups(graph: Graph, options: SmoothOptions) -> list[_Group]:
    groups: dict[tuple[str, int], _Group] = {}
    for node in graph.model.graph.node:
        if node.op_type not in options.alphas:
            continue
        found = _consumer(graph, node)
        if found is None:
            continue
        axis, size, m_w = found
        key = (node.input[0], axis)
        group = groups.get(key)
        if group is None:
            dtype = graph.const(node.input[1]).dtype  # type: ignore[union-attr]
            group = _Group(node.input[0], axis, size, options.alphas[node.op_type], dtype=dtype)
            groups[key] = group
        elif group.size != size:
            continue
        group.consumers.append(node)
        group.m_w = m_w if group.m_w is None else np.maximum(group.m_w, m_w)
    return list(groups.values())


class _Runner:
    """Runs the float model with extra outputs over the calibration data."""

    def __init__(self, model: onnx.ModelProto, providers: Sequence[Any], threads: int) -> None:
        self.model = model
        self.providers = providers
        self.threads = threads

    def run(
        self, names: dict[str, int], calibration: DataSource, batches: int | None = None
    ) -> Any:
        """Yield ``{name: array}`` per batch for ``names`` (name -> ONNX element type)."""
        inputs = {i.name for i in self.model.graph.input}
        outputs = [n for n in names if n not in inputs]
        augmented = onnx.ModelProto()
        augmented.CopyFrom(self.model)
        present = {o.name for o in augmented.graph.output}
        for name in outputs:
            if name not in present:
                augmented.graph.output.append(
                    helper.make_tensor_value_info(name, names[name], None)
                )
        with tempfile.TemporaryDirectory(prefix="raysearch-sq-") as folder:
            if augmented.ByteSize() < _LARGE:
                source: Any = augmented.SerializeToString()
            else:
                source = os.path.join(folder, "model.onnx")
                onnx.save(augmented, source, save_as_external_data=True, location="model.data")
            session = make_session(source, self.threads, providers=self.providers)
            for feed in calibration.batches(0, batches):
                values = session.run(outputs, feed) if outputs else []
                found = dict(zip(outputs, values))
                found.update({n: feed[n] for n in names if n in inputs and n in feed})
                yield found


def _channel_max(array: np.ndarray, axis: int) -> np.ndarray:
    magnitude = np.abs(np.asarray(array, np.float32))
    magnitude = np.where(np.isfinite(magnitude), magnitude, 0.0)
    others = tuple(i for i in range(array.ndim) if i != array.ndim + axis)
    return magnitude.max(axis=others) if others else magnitude


def smooth_model(
    model: onnx.ModelProto,
    calibration: DataSource,
    options: SmoothOptions,
    *,
    providers: Sequence[Any] | None = None,
    threads: int = 1,
) -> dict[str, int]:
    """Smooth ``model`` in place; counts ``smoothed``, ``folded``, ``inserted``, ``consumers``."""
    graph = Graph(model)
    runner = _Runner(model, providers or ["CPUExecutionProvider"], threads)
    groups = _groups(graph, options)
    if not groups:
        return {"smoothed": 0, "folded": 0, "inserted": 0, "consumers": 0}
    kinds = {g.tensor: helper.np_dtype_to_tensor_dtype(g.dtype) for g in groups}
    maxima: dict[tuple[str, int], np.ndarray] = {}
    for found in runner.run(kinds, calibration):
        for group in groups:
            array = found.get(group.tensor)
            if array is None or array.ndim < -group.axis or array.shape[group.axis] != group.size:
                continue
            key = (group.tensor, group.axis)
            m_x = _channel_max(array, group.axis)
            maxima[key] = m_x if key not in maxima else np.maximum(maxima[key], m_x)
    groups = [g for g in groups if (g.tensor, g.axis) in maxima]
    scales = {
        id(g): smoothing_scales(maxima[(g.tensor, g.axis)], g.m_w, g.alpha)  # type: ignore[arg-type]
        for g in groups
    }
    plans = _fold_plans(graph, groups, scales, runner, calibration) if options.folding else {}
    counts = {"smoothed": 0, "folded": 0, "inserted": 0, "consumers": 0}
    for group in groups:
        s = scales[id(group)]
        for node in group.consumers:
            weight = graph.const(node.input[1])
            graph.scale(node, 1, _weight_factor(node, weight.ndim, s))  # type: ignore[union-attr]
        plan = plans.get(id(group))
        if plan is not None:
            graph.apply(plan)
            counts["folded"] += 1
        else:
            factor = shaped(1.0 / s, group.axis)
            graph.insert_mul(group.tensor, group.consumers, factor, group.dtype)
            counts["inserted"] += 1
        counts["smoothed"] += 1
        counts["consumers"] += len(group.consumers)
    graph.write()
    return counts


def _fold_plans(
    graph: Graph,
    groups: list[_Group],
    scales: dict[int, np.ndarray],
    runner: _Runner,
    calibration: DataSource,
) -> dict[int, list]:
    """A fold plan per group; tensors of unknown shape are probed on one batch first."""
    probed: set[str] = set()
    plans: dict[int, list] = {}
    for round_ in range(_PROBE_ROUNDS + 1):
        plans, unknown = {}, {}
        for group in groups:
            uses = graph.uses.get(group.tensor, [])
            if sorted(id(n) for n, _ in uses) != sorted(id(n) for n in group.consumers):
                continue  # another node reads X: it must stay as it is
            if any(index != 0 for _, index in uses):
                continue
            mark = len(graph.assumed)
            plan = graph.fold(group.tensor, group.axis, 1.0 / scales[id(group)])
            assumed = graph.assumed[mark:]
            if plan is None:
                continue
            # A shape still unknown after its probe, or after the last round: no fold.
            names = {name for name, _, _ in assumed}
            if names and (round_ == _PROBE_ROUNDS or names & probed):
                continue
            for name in names:
                unknown[name] = helper.np_dtype_to_tensor_dtype(group.dtype)
            plans[id(group)] = plan
        graph.assumed.clear()
        if not unknown:
            break
        _logger.debug("smooth_quant: probing the shapes of %s", sorted(unknown))
        for found in runner.run(unknown, calibration, batches=1):
            for name, array in found.items():
                graph.shapes[name] = list(np.shape(array))
        probed.update(unknown)
    return plans


@register_technique("smooth_quant")
class SmoothQuant(FloatModelTransform):
    """SmoothQuant on the float model (see the module)."""

    settings: ClassVar[Mapping[str, OptionSpec]] = {
        SWITCH: OptionSpec("bool", "SmoothQuant: migrate activation outliers into the weights"),
    }
    containers: ClassVar[Mapping[str, Mapping[str, OptionSpec]]] = {
        "extra_options": {
            "SmoothAlpha": OptionSpec(
                "float", "SmoothQuant migration strength alpha", low=0.0, high=1.0, requires=SWITCH
            ),
            "SmoothQuantAlphas": OptionSpec(
                "dict", "SmoothQuant alpha per op type (MatMul, Gemm, Conv)", requires=SWITCH
            ),
            "SmoothQuantOpTypes": OptionSpec(
                "str_list", "op types SmoothQuant smooths (MatMul, Gemm, Conv)", requires=SWITCH
            ),
            "SmoothQuantFolding": OptionSpec(
                "bool",
                "fold 1/s into the producer where possible (else insert a Mul)",
                requires=SWITCH,
            ),
        }
    }
    devices = frozenset({"cpu", "gpu"})

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        options = smooth_options(settings)
        if options is None:
            return None
        return json.dumps({"alphas": options.alphas, "folding": options.folding}, sort_keys=True)

    def transform(
        self,
        model_path: str,
        out_path: str,
        settings: Mapping[str, Any],
        calibration: DataSource,
    ) -> None:
        options = smooth_options(settings)
        model = onnx.load(model_path)
        constants_to_initializers(model)  # weights held by Constant nodes count too
        if options is not None:
            counts = smooth_model(
                model, calibration, options, providers=self.providers, threads=self.threads
            )
            _logger.info("smooth_quant: %s", counts)
        write_model(model, out_path)
