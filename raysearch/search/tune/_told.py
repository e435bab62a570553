"""What a searcher reads of a finished trial beyond its metric and objective: each objective's
value with several (:func:`sampler_values`), and whether it is a candidate, with its ``extra``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raysearch.ranking import is_candidate, objective_value
from raysearch.search.record.reported import reported_record
from raysearch.trialrecord import TrialRecord

__all__ = ["candidacy", "sampler_values"]


def sampler_values(
    record: TrialRecord | None, objective: float | None, names: Sequence[str]
) -> tuple[float, ...] | None:
    """Each of the objectives ``names`` of a finished trial as a multi-objective sampler is
    told them: ``objective`` for the metric, the others from ``record``; None when one is
    missing (a failed trial, a latency not measured).

    Example:
        >>> sampler_values(TrialRecord(latency_ms=2.5, model_size_bytes=3_000_000), 0.9,
        ...                ["metric", "latency_ms", "model_size_mb"])
        (0.9, 2.5, 3.0)
        >>> sampler_values(TrialRecord(model_size_bytes=3), 0.9, ["metric", "latency_ms"]) is None
        True
    """
    if objective is None or record is None:
        return None
    values = tuple(objective if n == "metric" else objective_value(record, n) for n in names)
    return None if None in values else values


def candidacy(result: dict[str, Any] | None) -> tuple[bool, dict[str, Any]]:
    """Whether the trial of Tune's ``result`` is a candidate, and its ``extra`` (which a
    fallback strategy reads).

    Example:
        >>> trial = {"status": "ok", "is_candidate": False, "extra": {"promoted": 1.0}}
        >>> candidacy({"trial": trial})
        (False, {'promoted': 1.0})
        >>> candidacy(None)
        (False, {})
    """
    trial = reported_record(result)
    if trial is None:
        return False, {}
    return is_candidate(trial), dict(trial.extra)
