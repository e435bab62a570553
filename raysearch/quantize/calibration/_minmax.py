"""MinMax calibration: ONNX Runtime's in-graph ``ReduceMin``/``ReduceMax`` pass, with the
non-finite tensors redone on their usable values, and the symmetric ranges derived afterwards.

One collection serves symmetric and asymmetric settings (``CalibTensorRangeSymmetric`` is
applied afterwards with ONNX Runtime's own formula, :func:`symmetrise`) except with
``CalibStridedMinMax``, where ONNX Runtime symmetrises each stride before merging.

Example:
    >>> ranges = TensorsData(CalibrationMethod.MinMax, {"x": (np.float32(-1), np.float32(3))})
    >>> [float(v) for v in symmetrise(ranges)["x"].range_value]
    [-3.0, 3.0]
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from raysearch.quantize.calibration._nonfinite import log_dropped, usable

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.quantize.calibration._calibrator import Calibrators
    from raysearch.quantize.calibration._request import CalibrationRequest

__all__ = ["collect_minmax", "minmax_ranges", "symmetrise"]


def collect_minmax(
    calibrators: Calibrators,
    model_path: str,
    data: DataSource,
    request: CalibrationRequest,
    providers: list[Any],
) -> TensorsData:
    """The MinMax ranges of every calibrated tensor over ``data``, non-finite values left out."""
    options = {
        "symmetric": bool(request.strided and request.is_symmetric),
        "moving_average": request.moving_average,
        "averaging_constant": request.averaging_constant,
    }
    with (
        calibrators.open(
            model_path, request.op_types, CalibrationMethod.MinMax, options, providers
        ) as cal,
        np.errstate(invalid="ignore", over="ignore"),  # inf ranges are redone below
    ):
        reader = calibrators.reader(data)
        if request.strided:
            total = len(reader)
            if total % request.strided:
                raise ValueError(
                    f"CalibStridedMinMax: {total} calibration batches are not divisible by "
                    f"the stride {request.strided}"
                )
            for first in range(0, total, request.strided):
                reader.set_range(first, first + request.strided)
                cal.collect_data(reader)
        else:
            cal.collect_data(reader)
        ranges = cal.compute_data()
    calibrators.stats.inference_passes += 1
    unusable = [
        name
        for name, value in ranges.items()
        if not all(usable(np.asarray(v)).all() for v in value.range_value)
    ]
    if unusable:
        _finite_minmax(calibrators, model_path, data, request, providers, ranges, sorted(unusable))
    return ranges


def minmax_ranges(
    collected: TensorsData, names: frozenset[str], request: CalibrationRequest
) -> TensorsData:
    """The ranges ``request`` asks for from a collection covering ``names``."""
    ranges = _subset_ranges(collected, names)
    if request.strided is None and request.is_symmetric:
        ranges = symmetrise(ranges)
    return ranges


def _finite_minmax(
    calibrators: Calibrators,
    model_path: str,
    data: DataSource,
    request: CalibrationRequest,
    providers: list[Any],
    ranges: TensorsData,
    names: list[str],
) -> None:
    """Replace non-finite ranges of ``names`` by ranges over their usable values."""
    lows: dict[str, list[np.ndarray]] = {name: [] for name in names}
    highs: dict[str, list[np.ndarray]] = {name: [] for name in names}
    dropped: dict[str, int] = {}
    with calibrators.open(
        model_path, request.op_types, CalibrationMethod.Percentile, {}, providers
    ) as cal:
        session = cal.infer_session
        for feed in data.batches():
            outputs = session.run(names, feed)  # only these tensors, whole
            calibrators.stats.inference_batches += 1
            for name, value in zip(names, outputs):
                flat = np.asarray(value).ravel()
                keep = usable(flat)
                dropped[name] = dropped.get(name, 0) + int(flat.size - np.count_nonzero(keep))
                flat = flat[keep]
                nan = np.array([np.nan], flat.dtype)
                # One (1,)-array per batch, like ONNX Runtime's reshaped ReduceMin output.
                lows[name].append(flat.min(keepdims=True) if flat.size else nan)
                highs[name].append(flat.max(keepdims=True) if flat.size else nan)
    calibrators.stats.inference_passes += 1
    log_dropped(dropped)
    for name in names:
        low, high = _merge_strides(lows[name], highs[name], request)
        ranges[name] = TensorData(lowest=low, highest=high)


def _merge_strides(
    lows: list[np.ndarray], highs: list[np.ndarray], request: CalibrationRequest
) -> tuple[np.ndarray, np.ndarray]:
    """One tensor's range from its per-batch ranges, merged as ONNX Runtime merges them."""
    total = len(lows)
    stride = request.strided or total
    symmetric = bool(request.strided and request.is_symmetric)
    merged: tuple[np.ndarray, np.ndarray] | None = None
    for first in range(0, total, stride):
        low, high = _reduce_batches(
            lows[first : first + stride], highs[first : first + stride], request.moving_average
        )
        if symmetric:
            bound = np.nanmax([np.abs(low), np.abs(high)], axis=0)
            low, high = -bound, bound
        if merged is None:
            merged = (low, high)
        elif request.moving_average:
            c = request.averaging_constant
            merged = (_average(merged[0], low, c), _average(merged[1], high, c))
        else:
            merged = (np.fmin(merged[0], low), np.fmax(merged[1], high))
    assert merged is not None
    # Nothing usable in any batch: the range ONNX Runtime gives an empty tensor.
    low, high = (np.where(np.isnan(v), 0, v).astype(v.dtype) for v in merged)
    return low, high


def _reduce_batches(
    lows: list[np.ndarray], highs: list[np.ndarray], moving_average: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``MinMaxCalibrater.compute_data``'s reduction of per-batch ranges, NaN batches skipped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: handled by the caller
        if moving_average:
            return np.nanmean(lows, axis=0), np.nanmean(highs, axis=0)
        return np.nanmin(lows, axis=0), np.nanmax(highs, axis=0)


def _average(old: np.ndarray, new: np.ndarray, constant: float) -> np.ndarray:
    """``MinMaxCalibrater.merge_range``'s moving average, NaN skipped on either side."""
    moved = old + constant * (new - old)
    return np.where(np.isnan(old), new, np.where(np.isnan(new), old, moved)).astype(old.dtype)


def _subset_ranges(ranges: TensorsData, names: frozenset[str]) -> TensorsData:
    if frozenset(ranges.keys()) == names:
        return ranges
    return TensorsData(ranges.calibration_method, {k: v for k, v in ranges.items() if k in names})


def symmetrise(ranges: TensorsData) -> TensorsData:
    """``MinMaxCalibrater.compute_data``'s symmetric ranges from its asymmetric ones."""
    pairs = {}
    for name, value in ranges.items():
        low, high = value.range_value
        max_absolute_value = np.nanmax([np.abs(low), np.abs(high)], axis=0)
        pairs[name] = (-max_absolute_value, max_absolute_value)
    return TensorsData(ranges.calibration_method, pairs)
