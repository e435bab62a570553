"""What a search returns (:class:`SearchResult`), read back from its outputs.

Example:
    >>> result = build_result(folder, summary, records, higher=False)   # doctest: +SKIP
    >>> result.stop_reason                                               # doctest: +SKIP
    'space_exhausted'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysearch.layout import RESULTS

__all__ = ["SearchResult", "build_result"]


@dataclass
class SearchResult:
    """What a search found.

    ``candidates`` lists the candidate trials (``trial_id``, ``metric``, ``params``,
    ``model_path``: None where the model was not kept, ``keep_candidates``), best first;
    ``results`` is the ``results.parquet`` table.
    """

    best_params: dict[str, Any] | None
    best_metric: float | None
    candidates: list[dict[str, Any]]
    summary: dict[str, Any]
    results: Any
    output_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def stop_reason(self) -> str:
        return self.summary.get("stop_reason", "")


def build_result(
    folder: Path, summary: dict[str, Any], records: list[dict[str, Any]], higher: bool
) -> SearchResult:
    """The result of the search in ``folder`` from its summary and its journal's records."""
    import pyarrow.parquet as pq

    candidates = [r for r in records if r.get("is_candidate")]
    candidates.sort(key=lambda r: r["metric"], reverse=higher)
    return SearchResult(
        best_params=summary.get("best_params"),
        best_metric=summary.get("best_metric"),
        candidates=[
            {
                "trial_id": r["trial_id"],
                "metric": r["metric"],
                "params": r.get("params"),
                "model_path": _model_path(folder, r.get("model_file")),
            }
            for r in candidates
        ],
        summary=summary,
        results=pq.read_table(folder / RESULTS),
        output_dir=folder,
        records=list(records),
    )


def _model_path(folder: Path, model_file: str | None) -> str | None:
    """Where a trial's model is, None when it was not kept (a finished search's journal still
    names the model of a candidate that ``keep_candidates`` removed later)."""
    path = folder / model_file if model_file else None
    return str(path) if path is not None and path.is_file() else None
