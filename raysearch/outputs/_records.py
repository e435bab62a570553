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


def best_record(
    records: Sequence[Mapping[str, Any]], higher_is_better: bool
) -> Mapping[str, Any] | None:
    """The complete trial with the best metric (the earliest one on a tie), or None."""
    best = None
    for record in order(records):
        metric = finite(record.get("metric"))
        if record.get("status") != "ok" or metric is None:
            continue
        if best is None or (
            metric > best["metric"] if higher_is_better else metric < best["metric"]
        ):
            best = record
    return best
