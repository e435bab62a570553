"""``CalibrationCache``: calibrate once per distinct *calibration*, quantize many times.

Settings that differ only after calibration share the ranges (ONNX Runtime's
``TensorsData``): MinMax per (moving average, its constant, ``CalibStridedMinMax``), with
``CalibTensorRangeSymmetric`` applied afterwards; histograms per kind (absolute or signed)
and bin count; an entry covering a superset of the tensors a setting needs serves it.

Histograms are bit-identical to ONNX Runtime's on finite data, binned at once within
``memory_budget``, else in a second pass. Non-finite activations (and +-the type's largest
value) are left out and counted. The key holds the providers' names: CPU and CUDA entries stay
apart. Entries live in a bounded LRU and, given a ``cache_dir``, on disk under a per-key lock.

Example:
    >>> request = CalibrationRequest.from_settings({"calibrate_method": "Percentile",
    ...                                             "extra_options": {"CalibPercentile": 99.99}})
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from raysearch.modelfile import cached_file_hash
from raysearch.providers import provider_names
from raysearch.quantize.calibration._calibrator import Calibrators
from raysearch.quantize.calibration._histogram import bin_batches, compute_ranges, range_pass
from raysearch.quantize.calibration._minmax import collect_minmax, minmax_ranges
from raysearch.quantize.calibration._request import (
    CalibrationRequest,
    tensors_to_calibrate,
)
from raysearch.quantize.calibration._store import CacheStats, Entry, EntryStore

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["CalibrationCache"]

_logger = logging.getLogger(__name__)

#: Part of every cache key: raised when what an entry holds changes.
_FORMAT_VERSION = 2


class CalibrationCache:
    """Calibration results shared by every setting that needs the same statistics, on disk in
    ``cache_dir`` too, ``memory_budget`` bounding the outputs a histogram pass keeps.
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
        self._stats = CacheStats()
        self._store = EntryStore(self.cache_dir, self.max_entries, self._stats)
        self._calibrators = Calibrators(threads, self._stats)
        self._computed: OrderedDict[tuple[Any, ...], TensorsData] = OrderedDict()
        self._lock = threading.RLock()

    @property
    def stats(self) -> dict[str, Any]:
        """The counters and ``calibration_s``."""
        return asdict(self._stats)

    @property
    def _entries(self) -> OrderedDict[tuple[Any, ...], Entry]:
        # The entries kept in memory (tests check the bound on them).
        return self._store.entries

    def tensors_range(
        self,
        model_path: str | os.PathLike,
        data: DataSource,
        request: CalibrationRequest,
        *,
        model_hash: str | None = None,
        providers: Sequence[Any] | None = None,
    ) -> tuple[TensorsData, bool]:
        """``quantize_static``'s ranges for ``request`` (a fresh copy) and whether they
        were cached.
        """
        model_path = os.fspath(model_path)
        providers = list(providers) if providers else self.providers
        with self._lock:
            model_hash = model_hash or cached_file_hash(model_path)
            inferred = self._calibrators.inferred_model(model_path)
            names = frozenset(tensors_to_calibrate(inferred, request.op_types))
            base = (
                _FORMAT_VERSION,
                model_hash,
                data.content_hash,
                data.batch_size,
                data.sample_is_feed,
                # Names, not options: one kind of device shares entries whatever its GPU.
                tuple(provider_names(providers)),
            )
            if request.method == "MinMax":
                result, hit = self._minmax(model_path, data, request, base, names, providers)
            else:
                result, hit = self._histogram(model_path, data, request, base, names, providers)
            return copy.deepcopy(result), hit

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
        entry, hit = self._store.lookup(key, "minmax", names)
        if entry is None:
            with self._store.lock(key):
                # Found after waiting: another trial calibrated meanwhile, no cache hit.
                entry, hit = self._store.lookup(key, "minmax", names, waited=True)
                if entry is None:
                    start = time.perf_counter()
                    ranges = collect_minmax(self._calibrators, model_path, data, request, providers)
                    self._count_calibration(start, "MinMax", len(ranges.keys()))
                    entry = Entry("minmax", frozenset(ranges.keys()), ranges)
                    self._store.store(key, entry)
        return minmax_ranges(entry.payload, names, request), hit

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
        compute_key = (key, names, request.method, *request.compute_params())
        cached = self._computed.get(compute_key)
        if cached is not None:
            self._computed.move_to_end(compute_key)
            self._stats.memory_hits += 1
            return cached, True
        entry, hit = self._store.lookup(key, "hist", names)
        if entry is None:
            with self._store.lock(key):
                entry, hit = self._store.lookup(key, "hist", names, waited=True)
                if entry is None:
                    histograms = self._collect_histograms(
                        model_path, data, request, base, names, providers
                    )
                    entry = Entry("hist", frozenset(histograms), histograms)
                    self._store.store(key, entry)
        histograms = {n: entry.payload[n] for n in entry.payload if n in names}
        result = compute_ranges(histograms, request)
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
        """Histograms of ``names``: pass one's ranges (cached on their own), then the binning."""
        start = time.perf_counter()
        stats_key = (*base, "stats")
        method = CalibrationMethod[request.method]
        calibrators = self._calibrators
        with calibrators.open(model_path, request.op_types, method, {}, providers) as cal:
            session = cal.infer_session
            outputs = [o.name for o in session.get_outputs()]
            selected = [(i, n) for i, n in enumerate(outputs) if n in cal.tensors_to_calibrate]
            if set(cal.tensors_to_calibrate) != names:
                _logger.warning(
                    "calibrator selected %d tensors, raysearch expected %d",
                    len(cal.tensors_to_calibrate),
                    len(names),
                )
            stats_entry, _ = self._store.lookup(stats_key, "stats", names)
            kept = None
            if stats_entry is None:
                ranges, kept = range_pass(calibrators, session, data, selected, self.memory_budget)
                stats_entry = Entry("stats", frozenset(ranges), ranges)
                self._store.store(stats_key, stats_entry)
            if kept is not None:  # everything fitted in memory: no second inference pass
                batches = iter(kept)
            else:
                batches = (
                    {name: out[index].ravel() for index, name in selected}
                    for out in calibrators.run_all(session, data)
                )
            histograms = bin_batches(batches, selected, stats_entry.payload, request)
        self._count_calibration(start, request.method, len(histograms))
        return histograms

    def _count_calibration(self, start: float, method: str, n_tensors: int) -> None:
        elapsed = time.perf_counter() - start
        self._stats.calibrations += 1
        self._stats.calibration_s += elapsed
        _logger.info("calibrated %d tensors with %s in %.2f s", n_tensors, method, elapsed)
