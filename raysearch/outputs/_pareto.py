"""``pareto.parquet``: the candidates on the Pareto front of the config's ``objectives``
(:func:`raysearch.ranking.pareto_front`), written when there are several: the rows of
``results.parquet`` (its columns) of those trials; and the summary's fields of the front.

Example:
    >>> write_pareto(out, rows, cfg)                                     # doctest: +SKIP
    {'objectives': ['metric', 'model_size_mb'], 'select': 'size', 'pareto_trial_ids': ['a']}
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from raysearch.layout import PARETO
from raysearch.outputs._table import results_table, write_parquet
from raysearch.ranking import pareto_front
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_pareto"]


def write_pareto(out: Path, rows: Sequence[TrialRecord], config: SearchConfig) -> dict[str, Any]:
    """Write ``out/pareto.parquet`` when ``config.objectives`` holds several (remove one an
    earlier config left otherwise); return the summary's ``objectives``, ``select`` and
    ``pareto_trial_ids`` (None with one objective)."""
    fields: dict[str, Any] = {
        "objectives": list(config.objectives),
        "select": config.select,
        "pareto_trial_ids": None,
    }
    if len(config.objectives) < 2:
        (out / PARETO).unlink(missing_ok=True)
        return fields
    front = pareto_front(rows, config.objectives, config.metric_higher_is_better)
    ids = [str(r.trial_id) for r in front]
    table = results_table(rows)  # the rows of results.parquet, its columns and types
    front_rows = pc.is_in(table["trial_id"], value_set=pa.array(ids, pa.string()))
    write_parquet(table.filter(front_rows), out / PARETO)
    fields["pareto_trial_ids"] = ids
    return fields
