"""Histogram calibration (Entropy, Percentile, Distribution) with bounded memory.

A first pass finds each tensor's range (:func:`range_pass`); the outputs are binned at once
when they fit in the memory budget, else batch by batch in a second pass (counts over fixed
bins add up). The ranges come from ONNX Runtime's own ``HistogramCollector``
(:func:`compute_ranges`).

Example:
    >>> hist, edges = bin_values(np.array([-1.0, 0.5, 1.0]), "value", 4, (-1.0, 1.0))
    >>> hist.tolist()
    [1, 0, 0, 2]
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData

from raysearch.quantize.calibration._nonfinite import log_dropped, usable

if TYPE_CHECKING:
    import onnxruntime as ort

    from raysearch.data import DataSource
    from raysearch.quantize.calibration._calibrator import Calibrators
    from raysearch.quantize.calibration._request import CalibrationRequest

__all__ = ["range_pass", "bin_batches", "bin_values", "compute_ranges"]

#: Histogram binning: pieces this large are binned directly, smaller ones grouped up to
#: _BUFFER_BYTES first.
_DIRECT_BYTES = 4 << 20
_BUFFER_BYTES = 64 << 20


def range_pass(
    calibrators: Calibrators,
    session: ort.InferenceSession,
    data: DataSource,
    selected: list[tuple[int, str]],
    memory_budget: int,
) -> tuple[dict[str, tuple[Any, ...]], list[dict[str, np.ndarray]] | None]:
    """Pass one: each tensor's (min, max, min |x|, max |x|), and the outputs if they fit in
    ``memory_budget`` (else None).
    """
    ranges: dict[str, list[Any]] = {}
    dropped: dict[str, int] = {}
    kept: list[dict[str, np.ndarray]] | None = []
    for outputs in calibrators.run_all(session, data):
        batch = {name: outputs[index].ravel() for index, name in selected}
        if kept is not None:
            if not kept:
                estimate = sum(a.nbytes for a in batch.values()) * data.num_batches
                if estimate > memory_budget:
                    kept = None
            if kept is not None:
                kept.append(batch)
        for name, flat in batch.items():
            found = _stats(flat, name, dropped)
            if found is None:
                continue
            old = ranges.get(name)
            ranges[name] = found if old is None else _widen(old, found)
    log_dropped(dropped)
    result: dict[str, tuple[Any, ...]] = {}
    for index, name in selected:
        if name in ranges:
            result[name] = tuple(ranges[name])
        else:  # empty (or nothing usable) in every sample: ONNX Runtime's collectors use 0
            dtype = session.get_outputs()[index].type
            zero = np.array(0, dtype=np.float16 if "float16" in dtype else np.float32)
            result[name] = (zero, zero, None, None)
    return result, kept


def _stats(flat: np.ndarray, name: str, dropped: dict[str, int]) -> list[Any] | None:
    """(min, max, min |x|, max |x|) of one tensor's usable values in one batch, or None."""
    if flat.size == 0:
        return None
    # NaN and +-inf show up in min or max: usable data costs no extra pass.
    low, high = flat.min(), flat.max()
    if not (usable(low) and usable(high)):
        keep = usable(flat)
        dropped[name] = dropped.get(name, 0) + int(flat.size - np.count_nonzero(keep))
        flat = flat[keep]
        if flat.size == 0:
            return None
        low, high = flat.min(), flat.max()
    absolute = np.abs(flat)
    return [low, high, absolute.min(), absolute.max()]


def _widen(old: list[Any], found: list[Any]) -> list[Any]:
    return [
        np.minimum(old[0], found[0]),
        np.maximum(old[1], found[1]),
        np.minimum(old[2], found[2]),
        np.maximum(old[3], found[3]),
    ]


def bin_batches(
    batches: Iterator[dict[str, np.ndarray]],
    selected: list[tuple[int, str]],
    ranges: Mapping[str, tuple[Any, ...]],
    request: CalibrationRequest,
) -> dict[str, tuple[Any, ...]]:
    """Bin every batch into each tensor's final bins (non-finite values outside them)."""
    kind, bins = request.histogram_kind, request.bins
    counts: dict[str, np.ndarray] = {}
    edges: dict[str, np.ndarray] = {}
    buffers: dict[str, list[np.ndarray]] = {name: [] for _, name in selected}
    buffered = 0
    limit = request.max_intermediate_outputs

    def add(name: str, values: np.ndarray) -> None:
        if ranges[name][2] is None:  # nothing usable in any sample
            return
        hist, hist_edges = bin_values(values, kind, bins, ranges[name])
        if name in counts:
            counts[name] += hist
        else:
            counts[name], edges[name] = hist, hist_edges

    def flush() -> None:
        nonlocal buffered
        for name, pieces in buffers.items():
            if pieces:
                add(name, pieces[0] if len(pieces) == 1 else np.concatenate(pieces))
                pieces.clear()
        buffered = 0

    for number, batch in enumerate(batches, 1):
        for name, flat in batch.items():
            if flat.nbytes >= _DIRECT_BYTES:
                add(name, flat)
            elif flat.size:
                buffers[name].append(flat)
                buffered += flat.nbytes
        if buffered >= _BUFFER_BYTES or (limit and number % limit == 0):
            flush()
    flush()
    return _finish(selected, ranges, kind, bins, counts, edges)


def _finish(
    selected: list[tuple[int, str]],
    ranges: Mapping[str, tuple[Any, ...]],
    kind: str | None,
    bins: int,
    counts: dict[str, np.ndarray],
    edges: dict[str, np.ndarray],
) -> dict[str, tuple[Any, ...]]:
    """The histograms in ``HistogramCollector``'s layout, empty where nothing was binned."""
    histograms: dict[str, tuple[Any, ...]] = {}
    for _, name in selected:
        low, high = ranges[name][0], ranges[name][1]
        if name not in counts:  # no values at all: what ONNX Runtime bins for an empty array
            hist, hist_edges = bin_values(np.zeros(0, low.dtype), kind, bins, ranges[name])
            counts[name], edges[name] = hist, hist_edges
        if kind == "abs":
            histograms[name] = (counts[name], edges[name], low, high)
        else:
            threshold = np.array(max(abs(low), abs(high)), dtype=low.dtype)
            histograms[name] = (counts[name], edges[name], low, high, threshold)
    return histograms


def bin_values(
    values: np.ndarray, kind: str | None, bins: int, ranges: tuple[Any, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Histogram ``values`` exactly as ONNX Runtime's ``HistogramCollector`` does."""
    if kind == "abs":
        absolute = np.absolute(values)
        if ranges[2] is None:
            hist, hist_edges = np.histogram(absolute, bins=bins)
        else:
            hist, hist_edges = np.histogram(absolute, bins=bins, range=(ranges[2], ranges[3]))
        return hist, hist_edges.astype(values.dtype)
    low, high = ranges[0], ranges[1]
    threshold = np.array(max(abs(low), abs(high)), dtype=values.dtype)
    return np.histogram(values, bins, range=(-threshold, threshold))


def compute_ranges(
    histograms: dict[str, tuple[Any, ...]], request: CalibrationRequest
) -> TensorsData:
    """ONNX Runtime's own range computation (``HistogramCollector``) on collected histograms."""
    collector = HistogramCollector(
        method=request.method.lower(),
        symmetric=request.is_symmetric,
        num_bins=request.bins,
        num_quantized_bins=request.num_quantized_bins,
        percentile=request.percentile,
        scenario=request.scenario,
    )
    collector.histogram_dict = histograms
    with contextlib.redirect_stdout(io.StringIO()):
        result = collector.compute_collection_result()
    return TensorsData(CalibrationMethod[request.method], result)
