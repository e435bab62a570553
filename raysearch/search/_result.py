"""What a search returns (:class:`SearchResult`), read back from its outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysearch.layout import RESULTS
from raysearch.ranking import is_candidate
from raysearch.trialrecord import TrialRecord

__all__ = ["SearchResult", "build_result", "results_dataframe"]


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
        best_params: the best trial's settings (None: no trial succeeded).
        best_metric: its metric.
        candidates: the candidate trials (``trial_id``, ``metric``, ``params``,
            ``model_path``: None where the model was not kept, ``keep_candidates``), best
            first.
        summary: ``summary.json``.
        results: the ``results.parquet`` table (a ``pyarrow.Table``; :meth:`dataframe` for
            pandas).
        output_dir: the search's output folder.
        records: every trial's :class:`~raysearch.trialrecord.TrialRecord` (the journal's).
    """

    best_params: dict[str, Any] | None
    best_metric: float | None
    candidates: list[dict[str, Any]]
    summary: dict[str, Any]
    results: Any
    output_dir: Path
    records: list[TrialRecord] = field(default_factory=list, repr=False)

    @property
    def stop_reason(self) -> str:
        """Why the search ended (``summary.json``'s ``stop_reason``)."""
        return self.summary.get("stop_reason", "")

    def dataframe(self) -> Any:
        """``results.parquet`` as a pandas ``DataFrame``: one row per trial, in start order, a
        list or mapping setting a Python list or dict in its cell.

        Returns:
            A ``pandas.DataFrame``.

        Raises:
            ImportError: pandas is not installed.

        Example:
            >>> df = AutoSearch("config.yaml").run().dataframe()          # doctest: +SKIP
            >>> df.loc[df.is_candidate, ["trial_id", "metric"]]            # doctest: +SKIP
        """
        return results_dataframe(self.results)


def results_dataframe(table: Any) -> Any:
    """``table`` (``results.parquet``) as pandas, each list or mapping cell a Python list or
    dict.

    Example:
        >>> import pyarrow as pa
        >>> table = pa.table({"params/nodes_to_exclude": [["a", "b"], None],
        ...                   "params/op_types": ['["Conv"]', "[1, 2]"]})
        >>> df = results_dataframe(table)
        >>> df["params/nodes_to_exclude"].tolist(), df["params/op_types"].tolist()
        ([['a', 'b'], None], [['Conv'], [1, 2]])
    """
    import pyarrow as pa

    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas comes with most installs
        raise ImportError("SearchResult.dataframe() needs pandas: pip install pandas") from exc
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table.column(name)
        values = column.to_pylist()
        if name.startswith("params/") and pa.types.is_string(column.type):
            values = [_decoded(v) for v in values]
        columns[name] = values
    frame = pd.DataFrame({name: pd.Series(v, dtype=object) for name, v in columns.items()})
    scalar = [
        name
        for name in table.column_names
        if not any(isinstance(v, (list, dict)) for v in columns[name])
    ]
    if scalar:
        frame[scalar] = table.select(scalar).to_pandas()
    return frame


def _decoded(value: Any) -> Any:
    """A ``params/`` string cell: the list or mapping it holds as JSON text, else itself."""
    import json

    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)  # text from "[" or "{" is a list or a mapping, or no JSON
        except ValueError:
            return value
    return value


def build_result(
    folder: Path, summary: dict[str, Any], records: list[TrialRecord], higher: bool
) -> SearchResult:
    """The result of the search in ``folder`` from its summary and its journal's records."""
    import pyarrow.parquet as pq

    candidates = [r for r in records if is_candidate(r)]
    candidates.sort(key=lambda r: r.metric, reverse=higher)
    # Read as one file: pq.read_table imports Arrow's dataset API, slower than the read.
    with pq.ParquetFile(folder / RESULTS) as results:
        table = results.read()
    return SearchResult(
        best_params=summary.get("best_params"),
        best_metric=summary.get("best_metric"),
        candidates=[
            {
                "trial_id": r.trial_id,
                "metric": r.metric,
                "params": r.params,
                "model_path": _model_path(folder, r.model_file),
            }
            for r in candidates
        ],
        summary=summary,
        results=table,
        output_dir=folder,
        records=list(records),
    )


def _model_path(folder: Path, model_file: str | None) -> str | None:
    """Where a trial's model is; None when it was not kept."""
    path = folder / model_file if model_file else None
    return str(path) if path is not None and path.is_file() else None
