"""``CalibrationCache``: calibrate once, quantize many times.

ONNX Runtime's ``quantize_static`` runs calibration inference for every call. Most settings of
a search differ only in what happens *after* calibration (quant types, symmetry, per-channel,
excluded nodes, the percentile of a histogram...), so raysearch calibrates once per distinct
*calibration* and hands the ranges (ONNX Runtime's ``TensorsData``) to the quantizer.

What is shared:

- **MinMax**: one collection per (moving average, its constant, ``CalibStridedMinMax``).
  ``CalibTensorRangeSymmetric`` is applied afterwards with ONNX Runtime's own formula, so
  symmetric and asymmetric settings share it (except with ``CalibStridedMinMax``, where ONNX
  Runtime symmetrises each stride before merging).
- **Histograms** (Entropy, Percentile, Distribution): one collection per histogram *kind* and
  bin count. ONNX Runtime builds an absolute-value histogram for symmetric Percentile (its
  default) and a signed one for everything else, so Entropy, Distribution and asymmetric
  Percentile with the same ``num_bins`` share one histogram, and every percentile value is a
  1-3 ms computation on it. ``num_quantized_bins``, ``CalibPercentile`` and ``scenario`` never
  cause calibration inference.
- **Tensor sets**: ``op_types_to_quantize`` decides which tensors are calibrated. An entry
  that covers a superset of the tensors a setting needs serves it (per-tensor statistics do not
  depend on which other tensors are collected).

Histograms are bit-identical to ONNX Runtime's single ``collect_data`` call on finite data
(which keeps every intermediate output of every sample in memory: about 6 GB for 200 magika
samples with every op type), with bounded memory: a first pass finds each tensor's range; if
the calibrated tensors of the whole data set fit in ``memory_budget`` they are kept and binned
at once, otherwise a second inference pass bins them batch by batch (``np.histogram`` counts
add up when the bins are fixed). Memory then stays at one batch of intermediate outputs plus
64 MB. Pass-one ranges are cached too, so another histogram kind or bin count needs one pass.

Non-finite activations: NaN, +-inf and +-the float type's largest value (what additive
attention masks hold: ``-inf``, or ``torch.finfo(float32).min`` in Hugging Face models) are
left out of ranges and histograms, and their count is logged. Without that, a masked tensor's
range is infinite: MinMax gives infinite scales and every histogram method fails. MinMax keeps
ONNX Runtime's in-graph ``ReduceMin``/``ReduceMax`` pass; only the tensors whose range comes out
non-finite get a second pass that reads them whole and drops those values.

Calibration inference runs on the execution providers it is given (a trial's providers, CUDA
options included), as the trial's evaluation does. The cache key holds the providers' names
but not their options, so trials on the same kind of device share entries whatever their GPU
index or memory share; CPU and CUDA entries are kept apart because their kernels may round
differently, as the float reference's key does.

Entries live in memory (a bounded LRU per process) and, given a ``cache_dir``, on disk
(MinMax as ONNX Runtime's ``save_tensors_data`` JSON, histograms as ``.npz``), written to a
temporary file and renamed, under a per-key file lock so concurrent processes calibrate once.

Example:
    >>> from raysearch.quantize.calibration import CalibrationCache, CalibrationRequest
    >>> cache = CalibrationCache("~/.cache/raysearch")                         # doctest: +SKIP
    >>> request = CalibrationRequest.from_settings({"calibrate_method": "Percentile",
    ...                                             "extra_options": {"CalibPercentile": 99.99}})
    >>> ranges, hit = cache.tensors_range("model.onnx", data, request)         # doctest: +SKIP
    >>> cache.stats["calibrations"]                                            # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization.calibrate import (
    CalibrationMethod,
    HistogramCollector,
    MinMaxCalibrater,
    PercentileCalibrater,
    TensorData,
    TensorsData,
    load_tensors_data,
    save_tensors_data,
)
from onnxruntime.quantization.quant_utils import add_infer_metadata
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from raysearch.fileio import atomic_write_bytes
from raysearch.modelfile import file_hash
from raysearch.providers import provider_names
from raysearch.quantize.tempdirs import make_workdir

if TYPE_CHECKING:
    from raysearch.data import DataSource

try:  # POSIX file locks; elsewhere concurrent processes may calibrate the same key twice
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CalibrationCache",
    "CalibrationRequest",
    "DEFAULT_OP_TYPES",
    "HISTOGRAM_METHODS",
    "tensors_to_calibrate",
]

_logger = logging.getLogger(__name__)

#: The op types ``quantize_static`` quantizes (and calibrates) when none are given.
DEFAULT_OP_TYPES: tuple[str, ...] = tuple(sorted(set(QLinearOpsRegistry) | set(QDQRegistry)))
HISTOGRAM_METHODS = ("Entropy", "Percentile", "Distribution")
#: ``create_calibrator``'s defaults, per method.
_DEFAULT_BINS = {"Entropy": 128, "Percentile": 2048, "Distribution": 2048}
_DEFAULT_QUANTIZED_BINS = 128
_DEFAULT_PERCENTILE = 99.999
#: Part of every cache key. 2: non-finite values left out, providers keyed by name.
_FORMAT_VERSION = 2
#: Histogram binning: pieces this large are binned directly, smaller ones grouped up to
#: _BUFFER_BYTES first.
_DIRECT_BYTES = 4 << 20
_BUFFER_BYTES = 64 << 20


@dataclass(frozen=True)
class CalibrationRequest:
    """The settings that decide calibration, read from a settings dict.

    ``op_types`` is what ``quantize_static`` calibrates: the setting's ``op_types_to_quantize``
    or, when that is empty, every op type ONNX Runtime quantizes. ``symmetric`` is
    ``CalibTensorRangeSymmetric`` (``None``: the method's default, true for Percentile).
    ``max_intermediate_outputs`` (``CalibMaxIntermediateOutputs``) only bounds memory: it is the
    number of batches buffered before histogram counts are merged. (ONNX Runtime 1.31's
    ``MinMaxCalibrater`` discards the buffered outputs when that count is reached instead of
    merging them; raysearch keeps MinMax ranges over every batch.)
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
    def from_settings(cls, settings: Mapping[str, Any]) -> CalibrationRequest:
        """Read ``calibrate_method``, ``op_types_to_quantize`` and the calibration keys of
        ``extra_options`` (``CalibTensorRangeSymmetric``, ``CalibMovingAverage``,
        ``CalibMovingAverageConstant``, ``CalibPercentile``, ``CalibStridedMinMax``,
        ``CalibMaxIntermediateOutputs``, ``num_bins``, ``num_quantized_bins``, ``scenario``)."""
        extra = dict(settings.get("extra_options") or {})
        method = settings.get("calibrate_method") or "MinMax"
        if method not in ("MinMax", *HISTOGRAM_METHODS):
            raise ValueError(f"unknown calibrate_method {method!r}")
        op_types = settings.get("op_types_to_quantize") or DEFAULT_OP_TYPES
        symmetric = extra.get("CalibTensorRangeSymmetric")
        return cls(
            method=method,
            op_types=tuple(sorted(set(op_types))),
            symmetric=None if symmetric is None else bool(symmetric),
            moving_average=bool(extra.get("CalibMovingAverage", False)),
            averaging_constant=float(extra.get("CalibMovingAverageConstant", 0.01)),
            percentile=float(extra.get("CalibPercentile", _DEFAULT_PERCENTILE)),
            num_bins=None if extra.get("num_bins") is None else int(extra["num_bins"]),
            num_quantized_bins=int(extra.get("num_quantized_bins", _DEFAULT_QUANTIZED_BINS)),
            scenario=str(extra.get("scenario", "same")),
            strided=int(extra["CalibStridedMinMax"]) if extra.get("CalibStridedMinMax") else None,
            max_intermediate_outputs=(
                int(extra["CalibMaxIntermediateOutputs"])
                if extra.get("CalibMaxIntermediateOutputs")
                else None
            ),
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


def tensors_to_calibrate(model: onnx.ModelProto, op_types: Sequence[str] | None) -> list[str]:
    """The tensors ONNX Runtime calibrates for ``op_types`` on a shape-inferred ``model``:
    float and float16 inputs and outputs of the nodes of those op types, initializers excluded
    (the rule of ``CalibraterBase.select_tensors_to_calibrate``), sorted."""
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


@dataclass
class _Entry:
    kind: str  # "minmax" | "stats" | "hist"
    names: frozenset[str]
    payload: Any  # TensorsData | dict[name, stats tuple] | dict[name, histogram tuple]


@dataclass
class CacheStats:
    """Counters for tests and reports."""

    calibrations: int = 0  # calibrations computed (cache misses that ran inference)
    inference_passes: int = 0  # passes over the calibration data
    inference_batches: int = 0  # session.run calls during calibration
    memory_hits: int = 0
    disk_hits: int = 0
    calibration_s: float = 0.0


class CalibrationCache:
    """Calibration results shared by every setting that needs the same statistics.

    ``cache_dir`` (optional) keeps entries on disk for other processes and resumed searches;
    ``max_entries`` bounds the entries kept in memory. ``threads`` sets the calibration
    sessions' intra-op threads; ``providers`` (ONNX Runtime's ``providers`` argument, names or
    ``(name, options)`` pairs) is where they run unless a call says otherwise (a trial passes its
    own, see :meth:`tensors_range`). ``memory_budget`` (bytes) bounds the intermediate
    outputs a histogram collection keeps: when the calibrated tensors of the whole data set fit,
    one inference pass is enough; otherwise a second pass bins them batch by batch.

    Example:
        >>> cache = CalibrationCache(cache_dir="/tmp/rs-cache", threads=2)     # doctest: +SKIP
        >>> ranges, hit = cache.tensors_range("model.onnx", data,             # doctest: +SKIP
        ...     CalibrationRequest(method="MinMax", op_types=("MatMul",)))
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike | None = None,
        max_entries: int = 16,
        *,
        threads: int | None = None,
        providers: Sequence[Any] | None = None,
        memory_budget: int = 1 << 30,
    ) -> None:
        self.cache_dir = (
            Path(os.path.expanduser(os.fspath(cache_dir))) / "calibration" if cache_dir else None
        )
        self.max_entries = max(1, int(max_entries))
        self.threads = threads
        self.providers: list[Any] = list(providers) if providers else ["CPUExecutionProvider"]
        self.memory_budget = int(memory_budget)
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._computed: OrderedDict[tuple[Any, ...], TensorsData] = OrderedDict()
        self._hashes: dict[tuple[str, int, int], str] = {}
        self._inferred: dict[str, onnx.ModelProto] = {}
        self._lock = threading.RLock()
        self._stats = CacheStats()

    # -- public ----------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """``calibrations``, ``inference_passes``, ``inference_batches``, ``memory_hits``,
        ``disk_hits``, ``calibration_s``."""
        return asdict(self._stats)

    def tensors_range(
        self,
        model_path: str | os.PathLike,
        data: DataSource,
        request: CalibrationRequest,
        *,
        model_hash: str | None = None,
        providers: Sequence[Any] | None = None,
    ) -> tuple[TensorsData, bool]:
        """The calibrated ranges ``quantize_static`` would compute for ``request`` on the model
        at ``model_path`` with ``data``, and whether they came from the cache (no inference).

        Calibration inference runs on ``providers`` (default: the cache's). The returned
        ``TensorsData`` is a fresh copy: the quantizer may modify it.
        """
        model_path = os.fspath(model_path)
        providers = list(providers) if providers else self.providers
        with self._lock:
            model_hash = model_hash or self._model_hash(model_path)
            names = frozenset(
                tensors_to_calibrate(self._inferred_model(model_path), request.op_types)
            )
            base = (
                _FORMAT_VERSION,
                model_hash,
                data.content_hash,
                data.batch_size,
                data.sample_is_feed,
                # Names, not options: trials on one kind of device share entries whatever
                # their GPU index or memory share; CPU and CUDA kernels may round differently.
                tuple(provider_names(providers)),
            )
            if request.method == "MinMax":
                result, hit = self._minmax(model_path, data, request, base, names, providers)
            else:
                result, hit = self._histogram(model_path, data, request, base, names, providers)
            return copy.deepcopy(result), hit

    # -- MinMax ----------------------------------------------------------------------------
    def _minmax(
        self,
        model_path: str,
        data: DataSource,
        request: CalibrationRequest,
        base: tuple[Any, ...],
        names: frozenset[str],
        providers: list[Any],
    ) -> tuple[TensorsData, bool]:
        key = (*base, *request.collection_key())
        entry, hit = self._lookup(key, "minmax", names)
        if entry is None:
            with self._disk_lock(key):
                entry, hit = self._lookup(key, "minmax", names)
                if entry is None:
                    ranges = self._collect_minmax(model_path, data, request, providers)
                    entry = _Entry("minmax", frozenset(ranges.keys()), ranges)
                    self._store(key, entry)
        ranges = _subset_ranges(entry.payload, names)
        if request.strided is None and request.is_symmetric:
            ranges = _symmetrise(ranges)
        return ranges, hit

    def _collect_minmax(
        self,
        model_path: str,
        data: DataSource,
        request: CalibrationRequest,
        providers: list[Any],
    ) -> TensorsData:
        start = time.perf_counter()
        options = {
            "symmetric": bool(request.strided and request.is_symmetric),
            "moving_average": request.moving_average,
            "averaging_constant": request.averaging_constant,
        }
        with (
            self._calibrator(
                model_path, request.op_types, CalibrationMethod.MinMax, options, providers
            ) as cal,
            np.errstate(invalid="ignore", over="ignore"),  # inf ranges are redone below
        ):
            reader = _CountingReader(data.reader(), self._stats)
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
        self._stats.inference_passes += 1
        unusable = [
            name
            for name, value in ranges.items()
            if not all(_usable(np.asarray(v)).all() for v in value.range_value)
        ]
        if unusable:
            self._finite_minmax(model_path, data, request, providers, ranges, sorted(unusable))
        self._count_calibration(start, "MinMax", len(ranges.keys()))
        return ranges

    def _finite_minmax(
        self,
        model_path: str,
        data: DataSource,
        request: CalibrationRequest,
        providers: list[Any],
        ranges: TensorsData,
        names: list[str],
    ) -> None:
        """Replace the ranges of ``names`` (non-finite after ONNX Runtime's in-graph
        ``ReduceMin``/``ReduceMax``) by ranges over their usable values only, with ONNX
        Runtime's merging: min/max or mean over the batches (``CalibMovingAverage``), per
        stride and then across strides (``CalibStridedMinMax``)."""
        lows: dict[str, list[np.ndarray]] = {name: [] for name in names}
        highs: dict[str, list[np.ndarray]] = {name: [] for name in names}
        dropped: dict[str, int] = {}
        with self._calibrator(
            model_path, request.op_types, CalibrationMethod.Percentile, {}, providers
        ) as cal:
            session = cal.infer_session
            for feed in data.batches():
                outputs = session.run(names, feed)  # only these tensors, whole
                self._stats.inference_batches += 1
                for name, value in zip(names, outputs):
                    flat = np.asarray(value).ravel()
                    keep = _usable(flat)
                    dropped[name] = dropped.get(name, 0) + int(flat.size - np.count_nonzero(keep))
                    flat = flat[keep]
                    nan = np.array([np.nan], flat.dtype)
                    # One (1,)-array per batch, like ONNX Runtime's reshaped ReduceMin output.
                    lows[name].append(flat.min(keepdims=True) if flat.size else nan)
                    highs[name].append(flat.max(keepdims=True) if flat.size else nan)
        self._stats.inference_passes += 1
        _log_dropped(dropped)
        total = len(next(iter(lows.values())))
        stride = request.strided or total
        symmetric = bool(request.strided and request.is_symmetric)
        for name in names:
            merged: tuple[np.ndarray, np.ndarray] | None = None
            for first in range(0, total, stride):
                low, high = _reduce_batches(
                    lows[name][first : first + stride],
                    highs[name][first : first + stride],
                    request.moving_average,
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
            ranges[name] = TensorData(lowest=low, highest=high)

    # -- histograms ------------------------------------------------------------------------
    def _histogram(
        self,
        model_path: str,
        data: DataSource,
        request: CalibrationRequest,
        base: tuple[Any, ...],
        names: frozenset[str],
        providers: list[Any],
    ) -> tuple[TensorsData, bool]:
        key = (*base, *request.collection_key())
        compute_key = (key, names, request.method, *_compute_params(request))
        cached = self._computed.get(compute_key)
        if cached is not None:
            self._computed.move_to_end(compute_key)
            self._stats.memory_hits += 1
            return cached, True
        entry, hit = self._lookup(key, "hist", names)
        if entry is None:
            with self._disk_lock(key):
                entry, hit = self._lookup(key, "hist", names)
                if entry is None:
                    histograms = self._collect_histograms(
                        model_path, data, request, base, names, providers
                    )
                    entry = _Entry("hist", frozenset(histograms), histograms)
                    self._store(key, entry)
        histograms = {n: entry.payload[n] for n in entry.payload if n in names}
        result = _compute_ranges(histograms, request)
        self._computed[compute_key] = result
        while len(self._computed) > 4 * self.max_entries:
            self._computed.popitem(last=False)
        return result, hit

    def _collect_histograms(
        self,
        model_path: str,
        data: DataSource,
        request: CalibrationRequest,
        base: tuple[Any, ...],
        names: frozenset[str],
        providers: list[Any],
    ) -> dict[str, tuple[Any, ...]]:
        start = time.perf_counter()
        stats_key = (*base, "stats")
        method = CalibrationMethod[request.method]
        with self._calibrator(model_path, request.op_types, method, {}, providers) as cal:
            session = cal.infer_session
            outputs = [o.name for o in session.get_outputs()]
            selected = [(i, n) for i, n in enumerate(outputs) if n in cal.tensors_to_calibrate]
            if set(cal.tensors_to_calibrate) != names:
                _logger.warning(
                    "calibrator selected %d tensors, raysearch expected %d",
                    len(cal.tensors_to_calibrate),
                    len(names),
                )
            stats_entry, _ = self._lookup(stats_key, "stats", names)
            kept = None
            if stats_entry is None:
                ranges, kept = self._range_pass(session, data, selected)
                stats_entry = _Entry("stats", frozenset(ranges), ranges)
                self._store(stats_key, stats_entry)
            ranges = stats_entry.payload
            if kept is not None:  # everything fitted in memory: no second inference pass
                histograms = self._bin(iter(kept), selected, ranges, request)
            else:
                batches = (
                    {name: out[index].ravel() for index, name in selected}
                    for out in self._run_all(session, data)
                )
                histograms = self._bin(batches, selected, ranges, request)
        self._count_calibration(start, request.method, len(histograms))
        return histograms

    def _range_pass(
        self, session: ort.InferenceSession, data: DataSource, selected: list[tuple[int, str]]
    ) -> tuple[dict[str, tuple[Any, ...]], list[dict[str, np.ndarray]] | None]:
        """Pass one: per tensor (min, max, min |x|, max |x|) over every calibration sample,
        non-finite values left out (their count is logged).

        When the calibrated tensors of the whole data set fit in ``memory_budget`` (judged from
        the first batch), the flattened outputs are kept and returned so that binning needs no
        second inference pass; otherwise the second element is None."""
        ranges: dict[str, list[Any]] = {}
        dropped: dict[str, int] = {}
        kept: list[dict[str, np.ndarray]] | None = []
        for outputs in self._run_all(session, data):
            batch = {name: outputs[index].ravel() for index, name in selected}
            if kept is not None:
                if not kept:
                    estimate = sum(a.nbytes for a in batch.values()) * data.num_batches
                    if estimate > self.memory_budget:
                        kept = None
                if kept is not None:
                    kept.append(batch)
            for name, flat in batch.items():
                if flat.size == 0:
                    continue
                # NaN and +-inf show up in min or max: usable data costs no extra pass.
                low, high = flat.min(), flat.max()
                if not (_usable(low) and _usable(high)):
                    keep = _usable(flat)
                    dropped[name] = dropped.get(name, 0) + int(flat.size - np.count_nonzero(keep))
                    flat = flat[keep]
                    if flat.size == 0:
                        continue
                    low, high = flat.min(), flat.max()
                absolute = np.abs(flat)
                found = [low, high, absolute.min(), absolute.max()]
                old = ranges.get(name)
                if old is None:
                    ranges[name] = found
                else:
                    ranges[name] = [
                        np.minimum(old[0], found[0]),
                        np.maximum(old[1], found[1]),
                        np.minimum(old[2], found[2]),
                        np.maximum(old[3], found[3]),
                    ]
        _log_dropped(dropped)
        result: dict[str, tuple[Any, ...]] = {}
        for index, name in selected:
            if name in ranges:
                result[name] = tuple(ranges[name])
            else:  # empty (or nothing usable) in every sample: ONNX Runtime's collectors use 0
                dtype = session.get_outputs()[index].type
                zero = np.array(0, dtype=np.float16 if "float16" in dtype else np.float32)
                result[name] = (zero, zero, None, None)
        return result, kept

    def _bin(
        self,
        batches: Iterator[dict[str, np.ndarray]],
        selected: list[tuple[int, str]],
        ranges: Mapping[str, tuple[Any, ...]],
        request: CalibrationRequest,
    ) -> dict[str, tuple[Any, ...]]:
        """Bin every batch into each tensor's final bins. Counts add up over pieces because
        the bins are fixed; pieces under 4 MB are grouped (up to 64 MB, or
        ``CalibMaxIntermediateOutputs`` batches) so that tiny tensors cost few numpy calls.
        Non-finite values fall outside the bins' finite range, so ``np.histogram`` leaves them
        out; a tensor with no usable value at all (no |x| range) gets the empty histogram."""
        kind, bins = request.histogram_kind, request.bins
        counts: dict[str, np.ndarray] = {}
        edges: dict[str, np.ndarray] = {}
        buffers: dict[str, list[np.ndarray]] = {name: [] for _, name in selected}
        buffered = 0
        limit = request.max_intermediate_outputs

        def add(name: str, values: np.ndarray) -> None:
            if ranges[name][2] is None:  # nothing usable in any sample
                return
            hist, hist_edges = _bin(values, kind, bins, ranges[name])
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
        histograms: dict[str, tuple[Any, ...]] = {}
        for _, name in selected:
            low, high = ranges[name][0], ranges[name][1]
            if name not in counts:  # no values at all: what ONNX Runtime bins for an empty array
                hist, hist_edges = _bin(np.zeros(0, low.dtype), kind, bins, ranges[name])
                counts[name], edges[name] = hist, hist_edges
            if kind == "abs":
                histograms[name] = (counts[name], edges[name], low, high)
            else:
                threshold = np.array(max(abs(low), abs(high)), dtype=low.dtype)
                histograms[name] = (counts[name], edges[name], low, high, threshold)
        return histograms

    def _run_all(self, session: ort.InferenceSession, data: DataSource) -> Iterator[list[Any]]:
        for feed in data.batches():
            outputs = session.run(None, feed)
            self._stats.inference_batches += 1
            yield outputs
        self._stats.inference_passes += 1

    # -- calibrator and session --------------------------------------------------------------
    @contextlib.contextmanager
    def _calibrator(
        self,
        model_path: str,
        op_types: Sequence[str],
        method: CalibrationMethod,
        options: dict[str, Any],
        providers: list[Any],
    ) -> Iterator[Any]:
        """An ONNX Runtime calibrator over ``model_path``, built as ``create_calibrator``
        builds it but with this cache's threads and the given providers; its augmented model
        lives in a temporary directory that is removed afterwards."""
        workdir = str(make_workdir("raysearch-calib"))
        try:
            source = Path(model_path)
            # A model with external data (every model over 2 GB) makes an augmented model that
            # protobuf cannot serialize inline: ONNX Runtime must write its weights aside too.
            external = self._has_external_data(model_path)
            if not external:
                # ONNX Runtime writes a shape-inferred copy next to the model it reads (and
                # deletes it): give it a private link or copy, safe from concurrent processes.
                private = Path(workdir) / "model.onnx"
                try:
                    os.link(source, private)
                except OSError:
                    shutil.copyfile(source, private)
                source = private
            augmented = str(Path(workdir) / "augmented_model.onnx")
            if method == CalibrationMethod.MinMax:
                calibrator = MinMaxCalibrater(
                    source,
                    list(op_types),
                    augmented,
                    symmetric=options["symmetric"],
                    moving_average=options["moving_average"],
                    averaging_constant=options["averaging_constant"],
                    use_external_data_format=external,
                )
            else:  # only the augmented model and its session are used for histograms
                calibrator = PercentileCalibrater(
                    source, list(op_types), augmented, use_external_data_format=external
                )
            calibrator.augment_graph()
            session_options = ort.SessionOptions()
            session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            if self.threads:
                session_options.intra_op_num_threads = int(self.threads)
            session_options.log_severity_level = 3
            calibrator.execution_providers = providers
            calibrator.infer_session = ort.InferenceSession(
                augmented, sess_options=session_options, providers=providers
            )
            try:
                yield calibrator
            finally:
                calibrator.infer_session = None  # release the session before the files go
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _count_calibration(self, start: float, method: str, n_tensors: int) -> None:
        elapsed = time.perf_counter() - start
        self._stats.calibrations += 1
        self._stats.calibration_s += elapsed
        _logger.info("calibrated %d tensors with %s in %.2f s", n_tensors, method, elapsed)

    def _model_hash(self, model_path: str) -> str:
        st = os.stat(model_path)
        key = (os.path.realpath(model_path), st.st_mtime_ns, st.st_size)
        if key not in self._hashes:
            self._hashes[key] = file_hash(model_path)
        return self._hashes[key]

    def _has_external_data(self, model_path: str) -> bool:
        model = self._inferred_model(model_path)
        return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)

    def _inferred_model(self, model_path: str) -> onnx.ModelProto:
        real = os.path.realpath(model_path)
        if real not in self._inferred:
            with tempfile.TemporaryDirectory(prefix="raysearch-infer-") as tmp:
                out = os.path.join(tmp, "inferred.onnx")
                onnx.shape_inference.infer_shapes_path(model_path, out)
                model = onnx.load(out, load_external_data=False)
            add_infer_metadata(model)
            self._inferred[real] = model
        return self._inferred[real]

    # -- storage -----------------------------------------------------------------------------
    def _lookup(
        self, key: tuple[Any, ...], kind: str, names: frozenset[str]
    ) -> tuple[_Entry | None, bool]:
        """An entry covering ``names``: from memory, else from disk (then kept in memory)."""
        for slot, entry in self._entries.items():
            if slot[0] == key and entry.kind == kind and names <= entry.names:
                self._entries.move_to_end(slot)
                self._stats.memory_hits += 1
                return entry, True
        entry = self._load(key, kind, names)
        if entry is not None:
            self._remember(key, entry)
            self._stats.disk_hits += 1
            return entry, True
        return None, False

    def _store(self, key: tuple[Any, ...], entry: _Entry) -> None:
        self._remember(key, entry)
        if self.cache_dir is not None:
            try:
                self._save(key, entry)
            except OSError as exc:
                _logger.warning("could not write the calibration cache: %s", exc)

    def _remember(self, key: tuple[Any, ...], entry: _Entry) -> None:
        for slot in [s for s, e in self._entries.items() if s[0] == key and e.kind == entry.kind]:
            if self._entries[slot].names <= entry.names:
                del self._entries[slot]  # the new entry covers it
        self._entries[(key, entry.kind, entry.names)] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _key_dir(self, key: tuple[Any, ...]) -> Path:
        assert self.cache_dir is not None
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        return self.cache_dir / digest

    @contextlib.contextmanager
    def _disk_lock(self, key: tuple[Any, ...]) -> Iterator[None]:
        if self.cache_dir is None or fcntl is None:
            yield
            return
        folder = self._key_dir(key)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = open(folder / ".lock", "a")  # noqa: SIM115
        except OSError:
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def _save(self, key: tuple[Any, ...], entry: _Entry) -> None:
        folder = self._key_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        key_file = folder / "key.json"
        if not key_file.exists():
            atomic_write_bytes(key_file, json.dumps([str(k) for k in key]).encode())
        names_hash = hashlib.sha256("\0".join(sorted(entry.names)).encode()).hexdigest()[:16]
        if entry.kind == "minmax":
            save_tensors_data(entry.payload, folder / f"minmax-{names_hash}.json")
            return
        arrays: dict[str, np.ndarray] = {}
        ordered = list(entry.payload)
        arrays["names"] = np.array(ordered, dtype=str)
        for i, name in enumerate(ordered):
            value = entry.payload[name]
            if entry.kind == "stats":
                if value[2] is None:
                    arrays[f"s{i}"] = np.array([value[0], value[1]], dtype=value[0].dtype)
                else:
                    arrays[f"s{i}"] = np.array(value, dtype=np.asarray(value[0]).dtype)
            else:  # (hist, edges, min, max[, threshold of a signed histogram])
                arrays[f"h{i}"] = value[0]
                arrays[f"e{i}"] = value[1]
                arrays[f"s{i}"] = np.array(value[2:], dtype=np.asarray(value[2]).dtype)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write_bytes(folder / f"{entry.kind}-{names_hash}.npz", buffer.getvalue())

    def _load(self, key: tuple[Any, ...], kind: str, names: frozenset[str]) -> _Entry | None:
        if self.cache_dir is None:
            return None
        folder = self._key_dir(key)
        if not folder.is_dir():
            return None
        suffix = ".json" if kind == "minmax" else ".npz"
        for path in sorted(folder.glob(f"{kind}-*{suffix}")):
            try:
                entry = self._read(path, kind)
            except Exception as exc:  # a damaged file is recomputed, never trusted
                _logger.warning("ignoring unreadable calibration cache file %s: %s", path, exc)
                continue
            if names <= entry.names:
                _logger.debug("calibration cache hit on disk: %s", path)
                return entry
        return None

    @staticmethod
    def _read(path: Path, kind: str) -> _Entry:
        if kind == "minmax":
            ranges = load_tensors_data(path)
            return _Entry(kind, frozenset(ranges.keys()), ranges)
        with np.load(path, allow_pickle=False) as archive:
            ordered = [str(n) for n in archive["names"]]
            payload: dict[str, tuple[Any, ...]] = {}
            for i, name in enumerate(ordered):
                s = archive[f"s{i}"]
                if kind == "stats":
                    payload[name] = tuple(s) if len(s) == 4 else (s[0], s[1], None, None)
                    continue
                hist, hist_edges = archive[f"h{i}"], archive[f"e{i}"]
                if len(hist) + 1 != len(hist_edges):
                    raise ValueError(f"histogram of {name!r} is inconsistent")
                if len(s) == 3:  # signed: ONNX Runtime keeps the threshold as a 0-d array
                    payload[name] = (hist, hist_edges, s[0], s[1], np.array(s[2], dtype=s.dtype))
                else:
                    payload[name] = (hist, hist_edges, s[0], s[1])
        return _Entry(kind, frozenset(payload), payload)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


class _CountingReader:
    """A calibration data reader that counts the batches it hands out."""

    def __init__(self, reader: Any, stats: CacheStats) -> None:
        self._reader = reader
        self._stats = stats

    def get_next(self) -> dict[str, np.ndarray] | None:
        feed = self._reader.get_next()
        if feed is not None:
            self._stats.inference_batches += 1
        return feed

    def __len__(self) -> int:
        return len(self._reader)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._reader.set_range(start_index, end_index)


def _usable(values: np.ndarray) -> np.ndarray:
    """Which values calibration takes in: finite and below the float type's largest
    magnitude (masks use that value, ``torch.finfo(dtype).min``, as a finite -inf)."""
    return np.abs(values) < np.finfo(values.dtype).max  # False for NaN and +-inf too


def _log_dropped(dropped: Mapping[str, int]) -> None:
    counts = {name: n for name, n in dropped.items() if n}
    if not counts:
        return
    listed = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{name} ({n})" for name, n in listed[:5])
    more = f" and {len(listed) - 5} more" if len(listed) > 5 else ""
    _logger.info(
        "calibration left out %d non-finite values (NaN, inf or the float type's largest "
        "magnitude, as attention masks hold) of %d tensors: %s%s",
        sum(counts.values()),
        len(counts),
        shown,
        more,
    )


def _reduce_batches(
    lows: list[np.ndarray], highs: list[np.ndarray], moving_average: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``MinMaxCalibrater.compute_data``'s reduction of per-batch ranges: the mean with a
    moving average, else min and max; batches without a usable value (NaN) are skipped."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: handled by the caller
        if moving_average:
            return np.nanmean(lows, axis=0), np.nanmean(highs, axis=0)
        return np.nanmin(lows, axis=0), np.nanmax(highs, axis=0)


def _average(old: np.ndarray, new: np.ndarray, constant: float) -> np.ndarray:
    """``MinMaxCalibrater.merge_range``'s moving average, where NaN (no usable value) is
    skipped on either side."""
    moved = old + constant * (new - old)
    return np.where(np.isnan(old), new, np.where(np.isnan(new), old, moved)).astype(old.dtype)


def _bin(
    values: np.ndarray, kind: str | None, bins: int, ranges: tuple[Any, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Histogram ``values`` exactly as ONNX Runtime's ``HistogramCollector`` does on the whole
    data: the absolute values over ``[min |x|, max |x|]``, or the signed values over
    ``[-threshold, threshold]``."""
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


def _compute_params(request: CalibrationRequest) -> tuple[Any, ...]:
    if request.method == "Percentile":
        return (request.percentile,)
    if request.method == "Entropy":
        return (request.num_quantized_bins,)
    return (request.scenario,)


def _compute_ranges(
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


def _subset_ranges(ranges: TensorsData, names: frozenset[str]) -> TensorsData:
    if frozenset(ranges.keys()) == names:
        return ranges
    return TensorsData(ranges.calibration_method, {k: v for k, v in ranges.items() if k in names})


def _symmetrise(ranges: TensorsData) -> TensorsData:
    """``MinMaxCalibrater.compute_data``'s symmetric ranges from its asymmetric ones."""
    pairs = {}
    for name, value in ranges.items():
        low, high = value.range_value
        max_absolute_value = np.nanmax([np.abs(low), np.abs(high)], axis=0)
        pairs[name] = (-max_absolute_value, max_absolute_value)
    return TensorsData(ranges.calibration_method, pairs)
