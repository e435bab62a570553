"""The finished-trial records an output is written from: their order, the best one.

Example:
    >>> rows = [{"trial_id": "b", "number": 2, "status": "ok", "metric": 0.1},
    ...         {"trial_id": "a", "number": 1, "status": "ok", "metric": 0.3}]
    >>> [r["trial_id"] for r in order(rows)], best_record(rows, higher_is_better=True)["trial_id"]
    (['a', 'b'], 'a')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["finite", "order", "best_record"]


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def order(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records in the order their trials started (``number``), ties by trial id."""

    def key(record: Mapping[str, Any]) -> tuple[int, str]:
        number = record.get("number")
        return (number if isinstance(number, int) else 1 << 62, str(record.get("trial_id")))

    return sorted(records, key=key)


def promoted(record: Mapping[str, Any]) -> float:
    """How many tensors the record's setting kept at higher precision (mixed precision)."""
    extra = record.get("extra")
    value = extra.get("promoted") if isinstance(extra, Mapping) else None
    return float(value) if isinstance(value, (int, float)) else 0.0


def better(
    record: Mapping[str, Any], than: Mapping[str, Any] | None, higher_is_better: bool
) -> bool:
    """Whether ``record`` (a complete trial) beats ``than``: a better metric, or the same
    metric with fewer tensors promoted (the faster model wins a tie).

    Example:
        >>> a = {"status": "ok", "metric": 0.9, "extra": {"promoted": 2}}
        >>> b = {"status": "ok", "metric": 0.9, "extra": {"promoted": 0}}
        >>> better(b, a, True), better(a, b, True)
        (True, False)
    """
    metric = finite(record.get("metric"))
    if record.get("status") != "ok" or metric is None:
        return False
    if than is None:
        return True
    best = finite(than.get("metric"))
    if best is None or metric != best:
        return best is None or (metric > best if higher_is_better else metric < best)
    return promoted(record) < promoted(than)


def best_record(
    records: Sequence[Mapping[str, Any]], higher_is_better: bool
) -> Mapping[str, Any] | None:
    """The complete trial with the best metric (fewest tensors promoted, then the earliest
    one on a tie), or None."""
    best = None
    for record in order(records):
        if better(record, best, higher_is_better):
            best = record
    return best
