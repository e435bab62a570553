"""Reading a ``.parquet`` file: one column per model input; list columns reshaped to the
input's shape, numbers cast to its type."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raysearch.data._inputs import ModelInput
from raysearch.errors import DataError, suggest

__all__ = ["read_parquet"]


def read_parquet(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    """One array per model input from the Parquet file ``path`` (a column each)."""
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
    """Cast floats to the model's float type, integers to its integer type when every value
    survives the cast (Parquet written from Python holds float64 and int64)."""
    if flat.dtype == target:
        return flat
    if np.issubdtype(flat.dtype, np.floating) and np.issubdtype(target, np.floating):
        return flat.astype(target)
    if np.issubdtype(flat.dtype, np.integer) and np.issubdtype(target, np.integer):
        cast = flat.astype(target)
        if np.array_equal(cast, flat):
            return cast
    return flat
