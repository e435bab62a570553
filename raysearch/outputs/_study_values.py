"""What a search's Optuna study holds with several ``objectives``: a direction and a value
of each, and the latencies timed again alone (:func:`timed_alone`).

Example:
    >>> objective_values(TrialRecord(metric=0.5, model_size_bytes=2_000_000),
    ...                  ("metric", "model_size_mb", "latency_ms"))
    [0.5, 2.0, inf]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.ranking import objective_value
from raysearch.trialrecord import TrialRecord

__all__ = ["study_directions", "objective_values", "timed_alone"]


def study_directions(higher: bool, objectives: Sequence[str] = ("metric",)) -> list[str]:
    """The study's direction of each of ``objectives``: the metric's own, the others minimized.

    Example:
        >>> study_directions(False, ("metric", "model_size_mb"))
        ['minimize', 'minimize']
        >>> study_directions(True, ("metric", "latency_ms"))
        ['maximize', 'minimize']
    """
    return [
        ("maximize" if higher else "minimize") if name == "metric" else "minimize"
        for name in objectives or ("metric",)
    ]


def objective_values(record: TrialRecord, objectives: Sequence[str]) -> list[float]:
    """The record's value of each objective as the study holds it (a missing one ``inf``)."""
    values = [objective_value(record, name) for name in objectives]
    return [math.inf if value is None else value for value in values]


def timed_alone(records: Sequence[TrialRecord], summary: Mapping[str, Any]) -> list[TrialRecord]:
    """``records`` with the latencies the search timed again alone after its last trial
    (``summary.json``'s ``*_retimed``), as ``results.parquet`` and ``pareto.parquet`` hold them.

    Example:
        >>> [r.latency_ms for r in timed_alone([TrialRecord(trial_id="a", latency_ms=9.0)],
        ...  {"latency_retimed": {"models": {"a": {"median_ms": 4.0}}}})]
        [4.0]
    """
    timed = {
        figure: (summary.get(figure.removesuffix("_ms") + "_retimed") or {}).get("models") or {}
        for figure in ("latency_ms", "decode_latency_ms", "prefill_latency_ms")
    }
    out: list[TrialRecord] = []
    for record in records:
        again = {
            figure: by_model[str(record.trial_id)]["median_ms"]
            for figure, by_model in timed.items()
            if str(record.trial_id) in by_model
        }
        out.append(record.replace(**again) if again else record)
    return out
