"""What a searcher reads of a finished trial, to tell its phases and samplers: the metric,
the sampler's objective, each objective's value with several (:func:`sampler_values`), and
whether the trial is a candidate with its ``extra``. Tune hands the searcher a result whose
record is JSON text (:mod:`raysearch.search.record.reported`), decoded by the caller; a
journal record is flat.

Example:
    >>> objective_value({"objective": 7.5}, 1.0), objective_value({}, 1.0)
    (7.5, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.ranking import is_candidate
from raysearch.search.record.reported import reported_record

__all__ = ["candidacy", "metric_value", "objective_value", "sampler_values"]


def metric_value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def objective_value(result: Mapping[str, Any], metric: float | None) -> float | None:
    """What a sampler is told of a finished trial: its ``objective`` (the metric moved for a
    quantized candidate, see :meth:`Evaluator.sampler_objective`), else its metric (a record
    journaled before the objective existed, or a searcher driven by hand)."""
    if metric is None:
        return None
    objective = metric_value(result.get("objective"))
    return metric if objective is None else objective


def sampler_values(
    record: Mapping[str, Any], objective: float | None, names: Sequence[str]
) -> tuple[float, ...] | None:
    """Each of the objectives ``names`` (:data:`raysearch.ranking.OBJECTIVES`) of a finished
    trial, as a multi-objective sampler is told them: ``objective`` (the sampler's objective,
    see :func:`objective_value`) for the metric, ``latency_ms`` and ``model_size_mb`` (from
    ``model_size_bytes``) from the trial's ``record`` (decoded from Tune's result by the
    caller, or a journal record). None when one is missing (a failed trial, a latency not
    measured).

    Example:
        >>> sampler_values({"latency_ms": 2.5, "model_size_bytes": 3e6}, 0.9,
        ...                ["metric", "latency_ms", "model_size_mb"])
        (0.9, 2.5, 3.0)
        >>> sampler_values({"model_size_bytes": 3e6}, 0.9, ["metric", "latency_ms"]) is None
        True
    """
    if objective is None:
        return None
    values = []
    for name in names:
        field_name = "model_size_bytes" if name == "model_size_mb" else name
        value = objective if name == "metric" else metric_value(record.get(field_name))
        if value is None:
            return None
        values.append(value / 1e6 if name == "model_size_mb" else value)
    return tuple(values)


def candidacy(result: dict[str, Any] | None) -> tuple[bool, dict[str, Any]]:
    """What a trial reported beyond its metric: whether it is a candidate, and its ``extra``
    (``promoted``, ``ranked`` of mixed precision, which a fallback strategy reads), from the
    record that Tune's result carries (as JSON text, or nested by a direct call).

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
