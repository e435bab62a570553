"""Calibration and evaluation data, checked against the model's inputs before any trial.

A :class:`DataSource` holds one array per model input, the first axis being the samples,
loaded from an ``.npz``, ``.npy`` or ``.parquet`` file, a directory of ``.npy`` or ``.npz``
files, a mapping ``{input name: array}`` or an ONNX Runtime ``CalibrationDataReader``
(drained once). Names, dtypes and shapes are checked against the model's inputs; a mismatch
raises :class:`DataError` with a one-line message. Pickles are never loaded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader

from raysearch.data._checks import as_array, check_arrays, declared, feed_batch
from raysearch.data._files import read_path
from raysearch.data._inputs import ModelInput, model_inputs
from raysearch.data._lm_inputs import complete_decoder_inputs
from raysearch.data._reader import drain_reader
from raysearch.errors import DataError

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
]


class DataSource:
    """Arrays for every model input, checked, batched and hashed.

    Build one with :meth:`load`. ``len(source)`` is the number of samples; :meth:`batches`
    yields feed dicts; :meth:`reader` gives a fresh ONNX Runtime ``CalibrationDataReader``.

    How samples become feeds: when an array has the model input's rank, its first axis is the
    model's batch axis. With a dynamic batch axis a feed holds ``batch_size`` samples (the last
    one may hold fewer); with a static batch axis of size ``k`` a feed holds exactly ``k``.
    When an array has one more axis than the model input, each sample is one whole feed.

    Example:
        >>> src = DataSource.load({"x": np.zeros((10, 4), np.float32)},   # doctest: +SKIP
        ...                       model_inputs("mlp.onnx"), batch_size=4)
        >>> len(src), [f["x"].shape[0] for f in src.batches()]             # doctest: +SKIP
        (10, [4, 4, 2])
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        inputs: Sequence[ModelInput],
        batch_size: int | None = None,
        *,
        label: str = "data",
    ) -> None:
        self.label = label
        self.inputs = [declared(spec, arrays.get(spec.name)) for spec in inputs]
        self.arrays: dict[str, np.ndarray] = check_arrays(arrays, self.inputs, label)
        first = self.inputs[0]
        array = self.arrays[first.name]
        #: True when each sample is one whole feed (array rank = model rank + 1).
        self.sample_is_feed = array.ndim == len(first.shape) + 1
        self.batch_size = feed_batch(self.inputs, self.sample_is_feed, batch_size, label)
        n = len(self)
        if not self.sample_is_feed and first.shape and isinstance(first.shape[0], int):
            if n % self.batch_size:
                raise DataError(
                    f"{label}: input '{first.name}' has a static batch of {self.batch_size}; "
                    f"{n} samples is not a multiple of it"
                )
        self._hash: str | None = None

    @classmethod
    def load(
        cls,
        spec: Any,
        inputs: Sequence[ModelInput] | str | os.PathLike | onnx.ModelProto,
        batch_size: int | None = None,
        *,
        label: str = "data",
    ) -> DataSource:
        """Load ``spec`` (a path, a mapping of arrays, a ``CalibrationDataReader`` or a
        ``DataSource``) and check it against ``inputs`` (a list of :class:`ModelInput` or the
        model itself). ``label`` names the data in errors (``"calibration data"``).

        Raises:
            DataError: the data cannot be read or does not fit the model's inputs.
        """
        if not isinstance(inputs, Sequence) or isinstance(inputs, str):
            inputs = model_inputs(inputs)
        inputs = list(inputs)
        if not inputs:
            raise DataError(f"{label}: the model has no inputs to feed")
        if isinstance(spec, DataSource):
            return cls(spec.arrays, inputs, batch_size or spec.batch_size, label=label)
        if isinstance(spec, Mapping):
            where = label
            arrays = {str(k): as_array(v, str(k), where) for k, v in spec.items()}
        elif isinstance(spec, (str, os.PathLike)):
            path = Path(os.path.expanduser(os.fspath(spec)))
            where = f"{label} '{path.name}'"
            arrays = read_path(path, inputs, where)
        elif hasattr(spec, "get_next") and callable(spec.get_next):
            where = f"{label} ({type(spec).__name__})"
            arrays = drain_reader(spec, inputs, where)
        else:
            raise DataError(
                f"{label}: expected a path (.npz, .npy, .parquet or a directory), a mapping of "
                f"arrays or a CalibrationDataReader, got {type(spec).__name__}"
            )
        arrays = complete_decoder_inputs(arrays, inputs)
        return cls(arrays, inputs, batch_size, label=where)

    def __len__(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    @property
    def samples_per_batch(self) -> int:
        """Samples in one full feed: ``batch_size``, or 1 when each sample is a feed."""
        return 1 if self.sample_is_feed else self.batch_size

    @property
    def num_batches(self) -> int:
        """Number of feeds one pass over the data makes."""
        per = self.samples_per_batch
        return (len(self) + per - 1) // per

    @property
    def content_hash(self) -> str:
        """sha256 over every array's name, dtype, shape and bytes (sorted by name); the same
        data gives the same hash in every process. Batch size is not part of it."""
        if self._hash is None:
            digest = hashlib.sha256(b"raysearch-data-v1")
            for name in sorted(self.arrays):
                array = self.arrays[name]
                digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
                step = max(1, (64 << 20) // max(1, array[:1].nbytes))
                for start in range(0, array.shape[0], step):
                    digest.update(np.ascontiguousarray(array[start : start + step]).data)
            self._hash = digest.hexdigest()
        return self._hash

    def batch_ranges(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int]]:
        """``(first, last)`` sample indices of each feed, over batches ``start..end``."""
        per = self.samples_per_batch
        n = len(self)
        stop = self.num_batches if end is None else min(end, self.num_batches)
        for b in range(max(0, start), stop):
            yield b * per, min(n, (b + 1) * per)

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """The feed dict of batch ``index``."""
        first, last = next(self.batch_ranges(index, index + 1))
        return self._feed(first, last)

    def batches(self, start: int = 0, end: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Yield feed dicts for batches ``start`` up to ``end`` (default: all)."""
        for first, last in self.batch_ranges(start, end):
            yield self._feed(first, last)

    def _feed(self, first: int, last: int) -> dict[str, np.ndarray]:
        if self.sample_is_feed:
            return {k: np.ascontiguousarray(a[first]) for k, a in self.arrays.items()}
        return {k: np.ascontiguousarray(a[first:last]) for k, a in self.arrays.items()}

    def reader(self, start: int = 0, end: int | None = None) -> ArrayDataReader:
        """A fresh ONNX Runtime ``CalibrationDataReader`` over batches ``start..end``."""
        return ArrayDataReader(self, start, end)

    def __repr__(self) -> str:
        return (
            f"DataSource({self.label}, samples={len(self)}, batch_size={self.batch_size}, "
            f"inputs={list(self.arrays)})"
        )


class ArrayDataReader(CalibrationDataReader):
    """An ONNX Runtime ``CalibrationDataReader`` over a :class:`DataSource`.

    ``len(reader)`` and :meth:`set_range` count feeds (batches), as ``quantize_static``'s
    ``CalibStridedMinMax`` expects.
    """

    def __init__(self, source: DataSource, start: int = 0, end: int | None = None) -> None:
        self.source = source
        self.start = start
        self.end = source.num_batches if end is None else min(end, source.num_batches)
        self._iter: Iterator[dict[str, np.ndarray]] | None = None

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._iter is None:
            self._iter = self.source.batches(self.start, self.end)
        return next(self._iter, None)

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start = start_index
        self.end = min(end_index, self.source.num_batches)
        self._iter = None
