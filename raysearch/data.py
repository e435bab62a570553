"""Calibration and evaluation data, checked against the model's inputs before any trial.

A :class:`DataSource` holds one array per model input, the first axis being the samples. It is
loaded from

- an ``.npz`` file (one array per input name),
- a single ``.npy`` file (a model with one input),
- a directory of ``.npy`` files (file stem = input name) or of ``.npz`` files (concatenated
  along the first axis in sorted file order),
- a ``.parquet`` file (one column per input; list columns are reshaped to the input's shape;
  float columns are cast to the input's float type, integer columns to its integer type when
  no value changes),
- a mapping ``{input name: array}``, or
- an ONNX Runtime ``CalibrationDataReader`` (drained once into arrays, so it can be reused and
  hashed).

Names, dtypes and shapes are checked against the model's inputs (graph inputs that are not
initializers); anything that does not match raises :class:`DataError` with a one-line message.
Pickles are never loaded.

Example:
    >>> from raysearch.data import DataSource, model_inputs
    >>> inputs = model_inputs("model.onnx")                                  # doctest: +SKIP
    >>> data = DataSource.load("calib.npz", inputs, batch_size=32)         # doctest: +SKIP
    >>> len(data), data.num_batches, data.content_hash[:12]                 # doctest: +SKIP
    (200, 7, '4be1c0a2f3d9')
    >>> for feed in data.batches():                                         # doctest: +SKIP
    ...     session.run(None, feed)
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader

from raysearch.errors import InputError, suggest

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
    "DEFAULT_BATCH_SIZE",
]

_logger = logging.getLogger(__name__)

#: Samples per batch when the model has a dynamic batch axis and no batch size was given.
DEFAULT_BATCH_SIZE = 16

_PICKLE_MESSAGE = "holds Python objects (pickled); raysearch never loads pickles"


class DataError(InputError):
    """Calibration or evaluation data that does not fit the model; the message is one line.

    ``DataError`` is a ``ValueError`` (through :class:`raysearch.errors.InputError`).
    """


@dataclass(frozen=True)
class ModelInput:
    """One model input: its name, numpy dtype and shape (an ``int`` per static dimension, the
    dimension's symbolic name or ``None`` per dynamic one; the whole shape is ``None`` when the
    model does not declare it, and the data's shape is then taken as it is, batch axis first)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    @property
    def has_dynamic_batch(self) -> bool:
        """True when the first dimension is dynamic (a batch axis of any size)."""
        return bool(self.shape) and not isinstance(self.shape[0], int)

    def shape_text(self) -> str:
        """The shape as users read it: ``[N, 4]`` (a dynamic dimension shows its name, or ``?``)."""
        if self.shape is None:
            return "(undeclared)"
        return "[" + ", ".join(_dim_text(d) for d in self.shape) + "]"


def _dim_text(dim: int | str | None) -> str:
    if isinstance(dim, int):
        return str(dim)
    return dim or "?"


def model_inputs(model: str | os.PathLike | onnx.ModelProto) -> list[ModelInput]:
    """The inputs a caller must feed: graph inputs minus initializers, in graph order.

    Example:
        >>> [i.name for i in model_inputs("model.onnx")]     # doctest: +SKIP
        ['bytes']
    """
    proto = (
        model
        if isinstance(model, onnx.ModelProto)
        else onnx.load(os.fspath(model), load_external_data=False)
    )
    initializers = {init.name for init in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise DataError(f"model input '{value.name}' is not a tensor; raysearch feeds tensors")
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if not tensor.HasField("shape"):
            found.append(ModelInput(value.name, dtype, None))
            continue
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or None)
        found.append(ModelInput(value.name, dtype, tuple(dims)))
    return found


# --------------------------------------------------------------------------------------------
# The data source
# --------------------------------------------------------------------------------------------


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
        self.inputs = [_declared(spec, arrays.get(spec.name)) for spec in inputs]
        self.arrays: dict[str, np.ndarray] = _check_arrays(arrays, self.inputs, label)
        first = self.inputs[0]
        array = self.arrays[first.name]
        #: True when each sample is one whole feed (array rank = model rank + 1).
        self.sample_is_feed = array.ndim == len(first.shape) + 1
        self.batch_size = _feed_batch(self.inputs, self.sample_is_feed, batch_size, label)
        n = len(self)
        if not self.sample_is_feed and first.shape and isinstance(first.shape[0], int):
            if n % self.batch_size:
                raise DataError(
                    f"{label}: input '{first.name}' has a static batch of {self.batch_size}; "
                    f"{n} samples is not a multiple of it"
                )
        self._hash: str | None = None

    # -- construction ----------------------------------------------------------------------
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
            arrays = {str(k): _as_array(v, str(k), where) for k, v in spec.items()}
        elif isinstance(spec, (str, os.PathLike)):
            path = Path(os.path.expanduser(os.fspath(spec)))
            where = f"{label} '{path.name}'"
            arrays = _read_path(path, inputs, where)
        elif hasattr(spec, "get_next") and callable(spec.get_next):
            where = f"{label} ({type(spec).__name__})"
            arrays = _drain_reader(spec, inputs, where)
        else:
            raise DataError(
                f"{label}: expected a path (.npz, .npy, .parquet or a directory), a mapping of "
                f"arrays or a CalibrationDataReader, got {type(spec).__name__}"
            )
        return cls(arrays, inputs, batch_size, label=where)

    # -- sizes -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    @property
    def num_samples(self) -> int:
        """Number of samples (the arrays' first axis)."""
        return len(self)

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
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))

    # -- identity --------------------------------------------------------------------------
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

    # -- iteration -------------------------------------------------------------------------
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
    ``CalibStridedMinMax`` expects; :meth:`chunks` yields readers over consecutive ranges.
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

    def rewind(self) -> None:
        """Start again from the first batch of the range."""
        self._iter = None

    def chunks(self, batches_per_chunk: int) -> Iterator[ArrayDataReader]:
        """Fresh readers over consecutive ranges of ``batches_per_chunk`` batches."""
        for first in range(self.start, self.end, max(1, batches_per_chunk)):
            yield ArrayDataReader(self.source, first, min(self.end, first + batches_per_chunk))


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _declared(spec: ModelInput, array: Any) -> ModelInput:
    """``spec``, with an undeclared shape taken from the data (every dimension dynamic)."""
    if spec.shape is not None or array is None:
        return spec
    return ModelInput(spec.name, spec.dtype, (None,) * max(1, np.ndim(array)))


def _feed_batch(
    inputs: Sequence[ModelInput], sample_is_feed: bool, batch_size: int | None, label: str
) -> int:
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise DataError(f"{label}: batch size must be a positive integer, got {batch_size!r}")
    if sample_is_feed:
        return 1
    first = inputs[0]
    if not first.shape:
        return 1
    if isinstance(first.shape[0], int):
        if batch_size is not None and batch_size != first.shape[0]:
            _logger.info(
                "%s: input '%s' has a static batch of %d; batch_size %d is not used",
                label,
                first.name,
                first.shape[0],
                batch_size,
            )
        return first.shape[0]
    return int(batch_size) if batch_size is not None else DEFAULT_BATCH_SIZE


def _check_arrays(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput], label: str
) -> dict[str, np.ndarray]:
    names = [i.name for i in inputs]
    extra = [k for k in arrays if k not in names]
    missing = [n for n in names if n not in arrays]
    if missing:
        hint = ""
        if len(extra) == 1 and len(missing) == 1:
            hint = f" (found '{extra[0]}' instead)"
        which = ", ".join(f"'{m}'" for m in missing)
        raise DataError(
            f"{label}: missing input {which}{hint}; the model's inputs are {', '.join(names)}"
        )
    if extra:
        raise DataError(
            f"{label}: array '{extra[0]}' is not a model input"
            + suggest(extra[0], names)
            + f"; the model's inputs are {', '.join(names)}"
        )
    checked: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for spec in inputs:
        array = arrays[spec.name]
        if not isinstance(array, np.ndarray):
            array = _as_array(array, spec.name, label)
        if array.dtype.hasobject:
            raise DataError(f"{label}: array '{spec.name}' {_PICKLE_MESSAGE}")
        if array.dtype != spec.dtype:
            raise DataError(
                f"{label}: input '{spec.name}' has dtype {array.dtype}, model expects {spec.dtype}"
            )
        rank = len(spec.shape)
        if array.ndim == rank and rank > 0:
            got, want, what = array.shape[1:], spec.shape[1:], "per batch"
            shown = tuple(array.shape)
        elif array.ndim == rank + 1:
            got, want, what = array.shape[1:], spec.shape, "per sample"
            shown = tuple(array.shape[1:])
        else:
            raise DataError(
                f"{label}: input '{spec.name}' has shape {tuple(array.shape)}, "
                f"model expects {spec.shape_text()}"
            )
        if any(isinstance(w, int) and g != w for g, w in zip(got, want)):
            raise DataError(
                f"{label}: input '{spec.name}' has shape {shown} {what}, "
                f"model expects {spec.shape_text()}"
            )
        counts[spec.name] = int(array.shape[0])
        checked[spec.name] = array
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"'{k}' {v}" for k, v in counts.items())
        raise DataError(f"{label}: inputs hold different numbers of samples ({detail})")
    if next(iter(counts.values())) == 0:
        raise DataError(f"{label}: holds 0 samples")
    ranks = {a.ndim - len(s.shape) for s, a in zip(inputs, checked.values())}
    if len(ranks) > 1:
        raise DataError(
            f"{label}: some inputs have a sample axis in front of the model's shape and some "
            "do not; give every input the same layout"
        )
    return checked


def _as_array(value: Any, name: str, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: input '{name}' is not an array: {exc}") from None
    if array.dtype.hasobject:
        raise DataError(f"{where}: array '{name}' {_PICKLE_MESSAGE}")
    return array


# --------------------------------------------------------------------------------------------
# Readers per format
# --------------------------------------------------------------------------------------------


def _read_path(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    if not path.exists():
        raise DataError(f"{where}: file not found: {path}")
    if path.is_dir():
        return _read_directory(path, inputs, where)
    if path.stat().st_size == 0:
        raise DataError(f"{where}: file is empty")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path, where)
    if suffix == ".npy":
        if len(inputs) != 1:
            names = ", ".join(i.name for i in inputs)
            raise DataError(
                f"{where}: a .npy file holds one array but the model has {len(inputs)} inputs "
                f"({names}); use an .npz file or a directory of .npy files named after them"
            )
        return {inputs[0].name: _read_npy(path, inputs[0].name, where)}
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, inputs, where)
    raise DataError(
        f"{where}: unsupported file type '{path.suffix or path.name}'; expected .npz, .npy, "
        ".parquet or a directory of .npy/.npz files"
    )


def _read_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(f"{where}: file is not a NumPy .npz archive") from None
        raise DataError(f"{where}: cannot read the file: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: cannot read the file: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{where}: file is not a NumPy .npz archive")
    arrays: dict[str, np.ndarray] = {}
    with archive:
        if not archive.files:
            raise DataError(f"{where}: holds no arrays")
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError as exc:
                if "bject" in str(exc) or "pickle" in str(exc):
                    raise DataError(f"{where}: array '{name}' {_PICKLE_MESSAGE}") from None
                raise DataError(f"{where}: cannot read array '{name}': {exc}") from None
    return arrays


def _read_npy(path: Path, name: str, where: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:
        if "bject" in str(exc) or "pickle" in str(exc):
            raise DataError(f"{where}: array '{name}' {_PICKLE_MESSAGE}") from None
        raise DataError(f"{where}: cannot read '{path.name}': {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: cannot read '{path.name}': {exc}") from None


def _read_directory(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    npz = [p for p in files if p.suffix.lower() == ".npz"]
    if not npy and not npz:
        raise DataError(f"{where}: directory holds no .npy or .npz files")
    if npy and npz:
        raise DataError(
            f"{where}: directory mixes .npy and .npz files; use .npy files named after the "
            "inputs or .npz files holding every input"
        )
    for p in npy + npz:
        if p.stat().st_size == 0:
            raise DataError(f"{where}: file '{p.name}' is empty")
    if npy:
        return {p.stem: _read_npy(p, p.stem, where) for p in npy}
    parts = [_read_npz(p, f"{where} file '{p.name}'") for p in npz]
    names = list(parts[0])
    for p, part in zip(npz, parts):
        if sorted(part) != sorted(names):
            raise DataError(
                f"{where}: '{p.name}' holds arrays {sorted(part)}, '{npz[0].name}' holds "
                f"{sorted(names)}; every file must hold the same inputs"
            )
    arrays = {}
    for name in names:
        pieces = [part[name] for part in parts]
        shapes = {piece.shape[1:] for piece in pieces}
        dtypes = {piece.dtype for piece in pieces}
        if len(shapes) > 1 or len(dtypes) > 1:
            raise DataError(
                f"{where}: array '{name}' differs between files "
                f"(shapes {sorted(map(str, shapes))}, dtypes {sorted(map(str, dtypes))})"
            )
        arrays[name] = np.concatenate(pieces, axis=0)
    return arrays


def _read_parquet(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where}: cannot read the Parquet file: {first}") from None
    columns = table.column_names
    if table.num_rows == 0:
        raise DataError(f"{where}: holds 0 rows")
    names = [i.name for i in inputs]
    arrays: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.name not in columns:
            extra = [c for c in columns if c not in names]
            hint = f" (found '{extra[0]}' instead)" if len(extra) == 1 else ""
            raise DataError(
                f"{where}: missing input '{spec.name}'{hint}; the model's inputs are "
                f"{', '.join(names)}"
            )
        arrays[spec.name] = _parquet_column(table.column(spec.name), spec, where)
    for column in columns:
        if column not in names:
            raise DataError(
                f"{where}: column '{column}' is not a model input"
                + suggest(column, names)
                + f"; the model's inputs are {', '.join(names)}"
            )
    return arrays


def _parquet_column(column: Any, spec: ModelInput, where: str) -> np.ndarray:
    import pyarrow as pa

    chunked = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if chunked.null_count:
        raise DataError(f"{where}: column '{spec.name}' holds {chunked.null_count} null values")
    values = chunked
    depth = 0
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or (pa.types.is_fixed_size_list(values.type))
    ):
        values = values.flatten()
        depth += 1
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        raise DataError(
            f"{where}: column '{spec.name}' holds {values.type} values; expected numbers or "
            "lists of numbers"
        )
    if values.null_count:
        raise DataError(f"{where}: column '{spec.name}' holds null values inside its lists")
    flat = _parquet_cast(values.to_numpy(zero_copy_only=False), spec.dtype)
    rows = len(chunked)
    if spec.shape is None:
        rest: tuple[Any, ...] = (None,) if depth else ()
    else:
        rest = spec.shape[1:]
    if depth == 0 and not rest:
        return flat.reshape(rows)
    dynamic = [i for i, d in enumerate(rest) if not isinstance(d, int)]
    static = int(np.prod([d for d in rest if isinstance(d, int)] or [1]))
    per_row, leftover = divmod(flat.size, rows)
    if leftover or (not dynamic and per_row != static) or (dynamic and per_row % max(static, 1)):
        raise DataError(
            f"{where}: column '{spec.name}' holds {flat.size} values over {rows} rows, which "
            f"do not reshape to the model's shape {spec.shape_text()}"
        )
    if len(dynamic) > 1:
        raise DataError(
            f"{where}: column '{spec.name}' cannot be reshaped: input '{spec.name}' has "
            f"{len(dynamic)} dynamic dimensions besides the batch ({spec.shape_text()}); use .npz"
        )
    shape = [d if isinstance(d, int) else -1 for d in rest]
    return flat.reshape(rows, *shape)


def _parquet_cast(flat: np.ndarray, target: np.dtype) -> np.ndarray:
    """Parquet written from Python holds float64 and int64: cast floats to the model's float
    type, and integers to its integer type when every value survives the cast."""
    if flat.dtype == target:
        return flat
    if np.issubdtype(flat.dtype, np.floating) and np.issubdtype(target, np.floating):
        return flat.astype(target)
    if np.issubdtype(flat.dtype, np.integer) and np.issubdtype(target, np.integer):
        cast = flat.astype(target)
        if np.array_equal(cast, flat):
            return cast
    return flat


def _drain_reader(reader: Any, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    feeds: list[Mapping[str, Any]] = []
    while True:
        feed = reader.get_next()
        if not feed:
            break
        if not isinstance(feed, Mapping):
            raise DataError(f"{where}: get_next() returned {type(feed).__name__}, expected a dict")
        feeds.append(feed)
    if not feeds:
        raise DataError(f"{where}: the reader yielded no data")
    names = list(feeds[0])
    arrays: dict[str, np.ndarray] = {}
    ranks = {i.name: len(i.shape) if i.shape is not None else None for i in inputs}
    for name in names:
        if any(feed.get(name) is None for feed in feeds):
            raise DataError(f"{where}: input '{name}' is missing from some feeds")
        pieces = [_as_array(feed[name], name, where) for feed in feeds]
        rank = ranks.get(name, 0)
        if rank is None:  # undeclared shape: feeds are batches
            rank = pieces[0].ndim
        if pieces[0].ndim == rank and rank > 0:
            shapes = {p.shape[1:] for p in pieces}
            if len(shapes) > 1:
                raise DataError(f"{where}: input '{name}' changes shape between feeds: {shapes}")
            arrays[name] = np.concatenate(pieces, axis=0)
        else:
            try:
                arrays[name] = np.stack(pieces)
            except ValueError:
                raise DataError(f"{where}: input '{name}' changes shape between feeds") from None
    return arrays
