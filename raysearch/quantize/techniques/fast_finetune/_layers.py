"""The layers of a QDQ model that fast fine-tuning rewrites, and the pass over them (see
:mod:`raysearch.quantize.techniques.fast_finetune`): which Conv/Gemm/MatMul nodes have a quantized
constant weight, their float counterparts, the activations captured by ONNX Runtime, and the
new integer weights written back."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from raysearch.modelfile import cached_file_hash
from raysearch.providers import make_session
from raysearch.quantize._qdq_graph import load_model, save_model

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.quantize.techniques.fast_finetune._options import FinetuneOptions

__all__ = ["finetune_model"]

_logger = logging.getLogger("raysearch.quantize.techniques.fast_finetune._fast_finetune")

_OPS = ("Conv", "Gemm", "MatMul")
_INT_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
              onnx.TensorProto.UINT16)  # fmt: skip


@dataclass
class _Layer:
    """A quantized-weight node of the quantized model and its float counterpart."""

    node: onnx.NodeProto
    weight_init: str
    problem: Any  # _torch.LayerProblem
    float_input: str
    float_output: str
    bias_init: str | None = None
    bias_scale: np.ndarray | None = None
    bias_zero_point: np.ndarray | None = None


def finetune_model(
    quantized_path: str | os.PathLike,
    float_path: str | os.PathLike,
    calibration: DataSource,
    options: FinetuneOptions,
    *,
    providers: Any = None,
    threads: int = 1,
    nodes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Fine-tune the QDQ model at ``quantized_path`` in place; one row per layer."""
    from raysearch.quantize.techniques.fast_finetune import _torch as ft

    if options.device.startswith("cuda") and not ft.cuda_available():
        raise ValueError(f"OptimDevice {options.device}: PyTorch sees no CUDA device")
    quantized_path = os.fspath(quantized_path)
    model = load_model(quantized_path)
    float_model = load_model(float_path)  # Constant-node weights found by name too
    layers, rows = _layers(model, float_model, ft, nodes)
    feeds = list(_feeds(calibration, options.data_size))
    float_names = [n for la in layers for n in (la.float_input, la.float_output)]
    float_key = (cached_file_hash(float_path), calibration.content_hash,
                 options.data_size)  # fmt: skip
    float_session = None
    with ft.torch_threads(threads):
        for layer in layers:
            name = layer.node.name
            pair = [layer.float_input, layer.float_output]
            cached = FLOAT_ACTIVATIONS.get(float_key, pair)
            if cached is None:
                if float_session is None:  # every layer cached: no float session at all
                    graph = _with_outputs(float_model, float_names)
                    float_session = make_session(graph, threads, providers=providers)
                cached = _capture(float_session, pair, feeds)
                FLOAT_ACTIVATIONS.put(float_key, pair, cached)
            x_float, target = cached
            session = make_session(
                _with_outputs(model, [layer.node.input[0]]), threads, providers=providers
            )
            (x_quantized,) = _capture(session, [layer.node.input[0]], feeds)
            del session
            try:
                fit = ft.fit_layer(
                    layer.problem, x_quantized, x_float, target,
                    algorithm=options.algorithm, iterations=options.iterations,
                    learning_rate=options.learning_rate, batch_size=options.batch_size,
                    seed=options.seed, device=options.device,
                )  # fmt: skip
            except ft.LayerMismatch as exc:
                _logger.warning("fast_finetune: %s left as it is: %s", name, exc)
                rows.append({"node": name, "op_type": layer.node.op_type, "skipped": str(exc)})
                continue
            if fit.changed:
                _write(model, layer, fit)
            _logger.info(
                "fast_finetune: %s %s MSE %.4g -> %.4g",
                name, options.algorithm, fit.mse_before, fit.mse_after,
            )  # fmt: skip
            rows.append(
                {"node": name, "op_type": layer.node.op_type, "mse_before": fit.mse_before,
                 "mse_after": fit.mse_after, "changed": fit.changed}
            )  # fmt: skip
    save_model(model, quantized_path)
    return rows


class FloatActivations:
    """The float model's layer inputs and outputs, kept for the next trial of the same model
    and data (least recently used out past ``max_bytes``).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], list[np.ndarray]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...], names: list[str]) -> list[np.ndarray] | None:
        entry = self._entries.get((*key, *names))
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end((*key, *names))
        self.hits += 1
        return entry

    def put(self, key: tuple[Any, ...], names: list[str], arrays: list[np.ndarray]) -> None:
        size = sum(a.nbytes for a in arrays)
        if size > self.max_bytes:
            return
        self._entries[(*key, *names)] = arrays
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= sum(a.nbytes for a in evicted)

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


#: Per process (a trial actor). 1 GiB by default; RAYSEARCH_FINETUNE_CACHE_MB sets it (0: off).
FLOAT_ACTIVATIONS = FloatActivations(
    int(float(os.environ.get("RAYSEARCH_FINETUNE_CACHE_MB", "1024")) * 2**20)
)


def _layers(
    model: onnx.ModelProto, float_model: onnx.ModelProto, ft: Any, only: list[str] | None
) -> tuple[list[_Layer], list[dict[str, Any]]]:
    """The layers to fine-tune, in graph order, and rows for the ones that cannot be."""
    inits = {t.name: t for t in model.graph.initializer}
    float_inits = {t.name: t for t in float_model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    layers, rows = [], []
    for node in model.graph.node:
        if node.op_type not in _OPS or len(node.input) < 2 or (only and node.name not in only):
            continue
        dq = producers.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        why = _unsupported(node, dq, inits, uses, float_nodes)
        if why:
            _logger.info("fast_finetune: %s not fine-tuned: %s", node.name, why)
            rows.append({"node": node.name, "op_type": node.op_type, "skipped": why})
            continue
        layers.append(_layer(node, dq, inits, float_inits, producers, float_nodes[node.name], ft))
    return layers, rows


def _unsupported(node, dq, inits, uses, float_nodes) -> str | None:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq.attribute}
    quantized = inits[dq.input[0]]
    if quantized.data_type not in _INT_TYPES:
        return f"weight type {onnx.TensorProto.DataType.Name(quantized.data_type)}"
    if attrs.get("block_size", 0):
        return "blocked quantization"
    if (
        len(dq.input) < 2
        or dq.input[1] not in inits
        or (len(dq.input) > 2 and dq.input[2] not in inits)
    ):
        return "scale or zero point not constant"
    if uses.get(node.input[1], 0) > 1 or uses.get(dq.input[0], 0) > 1:
        return "weight shared with other nodes"
    if node.op_type == "MatMul" and len(quantized.dims) != 2:
        return "MatMul weight is not 2-D"
    if node.name not in float_nodes:
        return "no node of that name in the float model"
    return None


def _layer(node, dq, inits, float_inits, producers, float_node, ft) -> _Layer:
    current = numpy_helper.to_array(inits[dq.input[0]])
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    zp = (
        numpy_helper.to_array(inits[dq.input[2]])
        if len(dq.input) > 2
        else np.zeros((), current.dtype)
    )
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    scale, zp = _broadcast(scale, current.ndim, axis), _broadcast(zp, current.ndim, axis)
    dequantized = scale * (current.astype(np.float32) - zp.astype(np.float32))
    weight = dequantized
    if float_node.input[1] in float_inits:
        candidate = numpy_helper.to_array(float_inits[float_node.input[1]]).astype(np.float32)
        weight = candidate if candidate.shape == current.shape else dequantized
    info = np.iinfo(current.dtype)
    qmin, qmax = int(info.min), int(info.max)
    if info.min < 0 and not np.any(zp):  # ONNX Runtime's symmetric signed range
        qmin = -qmax
    qmin = min(qmin, int(current.min()))
    layer = _Layer(node, dq.input[0], None, float_node.input[0], float_node.output[0])
    bias = bias_q = None
    if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2]:
        if len(float_node.input) > 2 and float_node.input[2] in float_inits:
            bias = numpy_helper.to_array(float_inits[float_node.input[2]]).astype(np.float32)
        bias_q = _bias(node.input[2], inits, producers, layer)
        if bias is None:
            bias = bias_q
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    layer.problem = ft.LayerProblem(
        node.op_type, attrs, weight, scale, zp.astype(np.float32), current.astype(np.int64),
        qmin, qmax, bias, bias_q,
    )  # fmt: skip
    return layer


def _bias(name: str, inits, producers, layer: _Layer) -> np.ndarray | None:
    """The bias as the quantized model has it (float), noting where AdaQuant writes it."""
    if name in inits:  # a float bias
        layer.bias_init = name
        return numpy_helper.to_array(inits[name]).astype(np.float32)
    dq = producers.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
        return None
    values = numpy_helper.to_array(inits[dq.input[0]])
    if values.dtype != np.int32 or len(dq.input) < 2 or dq.input[1] not in inits:
        return None
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    zp = numpy_helper.to_array(inits[dq.input[2]]) if len(dq.input) > 2 else np.zeros((), np.int32)
    layer.bias_init, layer.bias_scale, layer.bias_zero_point = dq.input[0], scale, zp
    return scale * (values.astype(np.float64) - zp).astype(np.float32)


def _broadcast(array: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A per-tensor or per-channel parameter shaped to broadcast against the weight."""
    if array.size == 1:
        return array.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = array.size
    return array.reshape(shape)


def _write(model: onnx.ModelProto, layer: _Layer, fit: Any) -> None:
    inits = {t.name: t for t in model.graph.initializer}
    old = inits[layer.weight_init]
    dtype = numpy_helper.to_array(old).dtype
    old.CopyFrom(numpy_helper.from_array(fit.weight.astype(dtype), layer.weight_init))
    if fit.bias is None or layer.bias_init is None:
        return
    bias = inits[layer.bias_init]
    if layer.bias_scale is None:
        bias.CopyFrom(numpy_helper.from_array(fit.bias.astype(np.float32), layer.bias_init))
        return
    info = np.iinfo(np.int32)
    q = np.round(fit.bias.astype(np.float64) / layer.bias_scale) + layer.bias_zero_point
    q = np.clip(q, info.min, info.max).astype(np.int32)
    bias.CopyFrom(numpy_helper.from_array(q, layer.bias_init))


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> bytes:
    """``model`` serialized with ``names`` added as graph outputs."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for name in dict.fromkeys(names):
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy.SerializeToString()


def _feeds(calibration: DataSource, limit: int | None) -> Iterator[dict[str, np.ndarray]]:
    """The calibration feeds holding its first ``limit`` samples (None: all)."""
    left = len(calibration) if limit is None else limit
    first = calibration.inputs[0].shape
    # A feed of a static batch is kept whole (DataSize then rounds up to whole feeds).
    whole = calibration.sample_is_feed or bool(first and isinstance(first[0], int))
    for feed in calibration.batches():
        if left <= 0:
            return
        count = 1 if calibration.sample_is_feed else len(next(iter(feed.values())))
        if count > left and not whole:
            feed, count = {k: v[:left] for k, v in feed.items()}, left
        left -= count
        yield feed


def _capture(
    session: Any, names: list[str], feeds: list[dict[str, np.ndarray]]
) -> list[np.ndarray]:
    """``names`` over every feed, concatenated along the first axis."""
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for feed in feeds:
        for part, value in zip(parts, session.run(names, feed), strict=True):
            part.append(np.asarray(value, dtype=np.float32))
    return [np.concatenate(p, axis=0) for p in parts]
