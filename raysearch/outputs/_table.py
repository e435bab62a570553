"""``results.parquet``: one row per trial, in start order, with one column per parameter.

A parameter's column is bool, int64, float64 or string when its values agree, an Arrow list or
struct where Arrow holds every value as it is, else JSON text.

Example:
    >>> table = results_table([TrialRecord(trial_id="a", number=1, status="ok", metric=0.1,
    ...                                    params={"per_channel": True})])
    >>> table.num_rows, table.column("params/per_channel").to_pylist()
    (1, [True])
    >>> table.column("quantizer").to_pylist()
    ['ort']
    >>> _column([["Conv", "MatMul"], None, []]).type
    ListType(list<item: string>)
    >>> _column([["Conv"], "all"]).to_pylist()  # no one Arrow type: JSON text
    ['["Conv"]', '"all"']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from raysearch.fileio import replacing
from raysearch.ranking import finite, order
from raysearch.space.catalogue import DEFAULT_BACKEND
from raysearch.space.space import json_default
from raysearch.trialrecord import TrialRecord

__all__ = ["RESULT_COLUMNS", "results_table", "write_parquet", "write_results_csv"]

#: Fixed columns of ``results.parquet`` and their Arrow types (``params/...`` follow).
RESULT_COLUMNS: dict[str, pa.DataType] = {
    "trial_id": pa.string(),
    "number": pa.int64(),
    "phase": pa.int64(),
    "stage": pa.string(),
    "status": pa.string(),
    "quantizer": pa.string(),
    "metric": pa.float64(),
    "is_candidate": pa.bool_(),
    "objective": pa.float64(),
    # Evaluation on growing subsets: the rows the metric is over, their share, and the rung
    # ASHA stopped the trial at.
    "eval_rows": pa.int64(),
    "eval_fraction": pa.float64(),
    "stopped_at_rung": pa.int64(),
    "duration_s": pa.float64(),
    "calibration_s": pa.float64(),
    "quantization_s": pa.float64(),
    "evaluation_s": pa.float64(),
    "calib_cache_hit": pa.bool_(),
    "model_size_bytes": pa.int64(),
    "latency_ms": pa.float64(),
    # A language-model metric's trial: one-token decode and prefill (else None).
    "decode_latency_ms": pa.float64(),
    "prefill_latency_ms": pa.float64(),
    "node": pa.string(),
    "node_id": pa.string(),
    "gpu_id": pa.string(),
    "device": pa.string(),
    "error": pa.string(),
    "model_file": pa.string(),
    # Why a model to keep is missing (its node was lost before it was fetched); else None.
    "model_lost": pa.string(),
    # How many times Ray Tune ran the trial again, and after what.
    "retries": pa.int64(),
    "retried_after": pa.string(),
    # A result of an earlier search (a probe of the probe cache): its search and trial.
    "reused_from": pa.string(),
}


def _column(values: list[Any]) -> pa.Array:
    """One Arrow column: bool, int64, float64 or string when the values agree, else JSON."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, pa.int64())
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, pa.string())
    held = _as_arrow(values, present)
    if held is not None:
        return held
    return pa.array(
        [
            None if v is None else json.dumps(v, sort_keys=True, default=json_default)
            for v in values
        ],
        pa.string(),
    )


def _as_arrow(values: list[Any], present: list[Any]) -> pa.Array | None:
    """``values`` as the Arrow list or struct column that holds each one as it is; None when
    none does."""
    if not (
        all(isinstance(v, list) for v in present) or all(isinstance(v, Mapping) for v in present)
    ):
        return None
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None
    if pa.types.is_null(array.type) or array.to_pylist() != values:
        return None
    return array


def _quantizer(record: TrialRecord) -> str:
    return str((record.settings or {}).get("quantizer") or DEFAULT_BACKEND)


def results_table(records: Sequence[TrialRecord]) -> pa.Table:
    """The ``results.parquet`` table of ``records`` (one row per trial, in start order)."""
    rows = order(records)
    columns: dict[str, pa.Array] = {}
    for name, dtype in RESULT_COLUMNS.items():
        values = [_quantizer(r) if name == "quantizer" else getattr(r, name) for r in rows]
        if dtype == pa.float64():
            values = [finite(v) for v in values]
        elif dtype == pa.int64():
            values = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
        elif dtype == pa.bool_():
            values = [None if v is None else bool(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
        columns[name] = pa.array(values, dtype)
    for name in dict.fromkeys(name for r in rows for name in r.params or {}):
        columns[f"params/{name}"] = _column([(r.params or {}).get(name) for r in rows])
    for name in dict.fromkeys(name for r in rows for name in r.extra):
        columns[f"extra/{name}"] = pa.array([finite(r.extra.get(name)) for r in rows], pa.float64())
    return pa.table(columns)


def write_results_csv(table: pa.Table, stream: TextIO) -> None:
    """``table`` (``results.parquet``) as CSV on ``stream``: an empty cell for a missing
    value, a list or mapping as its JSON text, booleans as ``true``/``false``.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> write_results_csv(pa.table({"trial_id": ["a"], "is_candidate": [True],
        ...                             "params/nodes": [["n1", "n2"]], "metric": [None]}), out)
        >>> print(out.getvalue().strip())
        trial_id,is_candidate,params/nodes,metric
        a,true,"[""n1"", ""n2""]",
    """
    import csv

    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow([_csv_cell(row[name]) for name in table.column_names])


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=json_default)
    return value


def write_parquet(table: pa.Table, path: Path) -> None:
    with replacing(path) as tmp:
        pq.write_table(table, tmp)
