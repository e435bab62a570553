"""The quantization noise of every quantized activation tensor of a QDQ model, for the
sensitivity ranking (:mod:`raysearch.quantize.techniques.mixed_precision.sensitivity`).

ONNX Runtime's ``qdq_loss_debug`` augments both models so that every tensor is an output and
matches each QDQ tensor before and after its quantize-dequantize with the float model's; its
``collect_activations`` then keeps every tensor of every batch (gigabytes for a transformer).
Here the augmented models run a few samples at a time and only sums of squares are kept:
per tensor, and per channel where the tensor's shape is known.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource

__all__ = ["activation_errors"]

_logger = logging.getLogger(__name__)


def activation_errors(
    float_path: str | os.PathLike,
    quantized_path: str | os.PathLike,
    float_model: onnx.ModelProto,
    data: DataSource,
    *,
    samples: int,
    providers: Sequence[Any] | None,
) -> tuple[dict[str, dict[str, float | None]], dict[str, float]]:
    """Per quantized activation: ``qdq_err``, ``xmodel_err`` and ``channel_err`` (SQNR, dB) on
    the first ``samples`` samples; and each quantized weight's SQNR.
    """
    import onnx
    from onnxruntime.quantization import qdq_loss_debug as debug

    shapes = _static_shapes(float_model)
    noise = _NoiseSums(shapes)
    workdir = tempfile.mkdtemp(prefix="raysearch-sensitivity-")
    try:
        sessions = {}
        for label, path in (("float", float_path), ("qdq", quantized_path)):
            # ONNX Runtime's augmenter writes and deletes a copy beside its input: it gets a
            # private copy, not the user's file.
            local = os.path.join(workdir, f"{label}-input.onnx")
            onnx.save(onnx.load(os.fspath(path)), local, save_as_external_data=True)
            augmented = os.path.join(workdir, f"{label}.onnx")
            debug.modify_model_output_intermediate_tensors(
                local, augmented, save_as_external_data=True
            )
            sessions[label] = _debug_session(augmented, providers)
        # Not ONNX Runtime's collect_activations, which keeps every tensor of every batch:
        # a few samples at a time, only per-channel sums of squares kept.
        for feed in _slices(data, samples):
            outputs = {label: _saved(session, feed) for label, session in sessions.items()}
            matching = debug.create_activation_matching(outputs["qdq"], outputs["float"])
            for tensor, match in matching.items():
                noise.add(tensor, match)
        with np.errstate(divide="ignore", invalid="ignore"):
            weights = debug.compute_weight_error(
                debug.create_weight_matching(os.fspath(float_path), os.fspath(quantized_path)),
                # ONNX Runtime's own error function fails on a scalar weight: 1-D views.
                lambda a, b: debug.compute_signal_to_quantization_noice_ratio(
                    np.atleast_1d(a), np.atleast_1d(b)
                ),
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    errors = noise.errors()
    return errors, weights


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape without the batch dimension, where shape inference knows it."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # shapes only refine the ranking; whole-tensor SQNR without them
        _logger.warning(
            "activation-noise ranking: ONNX shape inference failed (%s: %s); the noise is"
            " measured over whole tensors",
            type(exc).__name__,
            exc,
        )
        return {}
    graph = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for info in [*graph.value_info, *graph.input, *graph.output]:
        dims = info.type.tensor_type.shape.dim
        rest = [d.dim_value if d.HasField("dim_value") else 0 for d in list(dims)[1:]]
        if len(dims) >= 2 and all(v > 0 for v in rest):
            shapes[info.name] = tuple(rest)
    return shapes


#: Samples run through the augmented models at a time (every intermediate tensor is an output).
_SLICE = 4
_SAVED = "_ReshapedSavedOutput"  # qdq_loss_debug's suffix of a saved tensor's output


def _debug_session(path: str, providers: Sequence[Any] | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=_names(providers))


def _slices(data: DataSource, samples: int) -> Iterable[dict[str, np.ndarray]]:
    """Feeds of at most :data:`_SLICE` samples covering the first ``samples`` of ``data``."""
    left = min(samples, len(data))
    for feed in data.batches():
        rows = len(next(iter(feed.values())))
        for first in range(0, rows, _SLICE):
            if left <= 0:
                return
            take = min(_SLICE, left, rows - first)
            yield {name: array[first : first + take] for name, array in feed.items()}
            left -= take


def _saved(session: Any, feed: Mapping[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    values = session.run(None, dict(feed))
    return {
        name[: -len(_SAVED)]: [value]
        for name, value in zip(names, values, strict=True)
        if name.endswith(_SAVED)
    }


class _NoiseSums:
    """Sums of squares per tensor (and channel) of signal, quantization noise and float error."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.sums: dict[str, dict[str, Any]] = {}

    def add(self, tensor: str, match: Mapping[str, Sequence[np.ndarray]]) -> None:
        pre = np.asarray(match["pre_qdq"][0], dtype=np.float64)
        post = np.asarray(match["post_qdq"][0], dtype=np.float64)
        if pre.shape != post.shape or not pre.size:
            return
        sums = self.sums.setdefault(tensor, {"signal": 0.0, "noise": 0.0, "x": 0.0, "xn": 0.0})
        finite = np.isfinite(pre) & np.isfinite(post)
        pre, post = np.where(finite, pre, 0.0), np.where(finite, post, 0.0)
        sums["signal"] += float(np.sum(pre**2))
        sums["noise"] += float(np.sum((pre - post) ** 2))
        floats = match.get("float")
        if floats:
            reference = np.asarray(floats[0], dtype=np.float64)
            if reference.shape == post.shape:
                reference = np.where(np.isfinite(reference), reference, 0.0)
                sums["x"] += float(np.sum(reference**2))
                sums["xn"] += float(np.sum((reference - post) ** 2))
        shape = self.shapes.get(tensor)
        if shape and pre.size % int(np.prod(shape)) == 0:
            axis = 1 if len(shape) == 3 else len(shape)  # NCHW: channels first; else last
            pre = np.moveaxis(pre.reshape(-1, *shape), axis, -1)
            post = np.moveaxis(post.reshape(-1, *shape), axis, -1)
            channels = pre.shape[-1]
            signal = np.sum(pre.reshape(-1, channels) ** 2, axis=0)
            noise = np.sum((pre - post).reshape(-1, channels) ** 2, axis=0)
            sums["channel_signal"] = sums.get("channel_signal", 0.0) + signal
            sums["channel_noise"] = sums.get("channel_noise", 0.0) + noise

    def errors(self) -> dict[str, dict[str, float | None]]:
        """Per tensor: ``qdq_err``, ``xmodel_err`` and ``channel_err`` (median), in dB."""
        eps = float(np.finfo(np.float32).eps) ** 2
        out: dict[str, dict[str, float | None]] = {}
        for tensor, sums in self.sums.items():
            channel = None
            if "channel_signal" in sums:
                ratios = 10.0 * np.log10(
                    np.maximum(sums["channel_signal"], eps) / np.maximum(sums["channel_noise"], eps)
                )
                channel = float(np.median(ratios))
            out[tensor] = {
                "qdq_err": _db(sums["signal"], sums["noise"], eps),
                "xmodel_err": _db(sums["x"], sums["xn"], eps) if sums["x"] else None,
                "channel_err": channel,
            }
        return out


def _db(signal: float, noise: float, eps: float) -> float:
    return float(10.0 * np.log10(max(signal, eps) / max(noise, eps)))


def _names(providers: Sequence[Any] | None) -> list[str]:
    from raysearch.providers import provider_names

    return provider_names(list(providers)) if providers else ["CPUExecutionProvider"]
