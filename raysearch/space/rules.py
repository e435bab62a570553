"""Validity rules: settings that cannot be meant, found before they run.

Each rule is a named function of a point (the flat ``{key path: value}`` dict a searcher
produced) returning the key paths that are meaningless in it; raysearch strips those keys, so
``MinMax`` with ``CalibPercentile: 99.99`` becomes plain ``MinMax``, and a grid then drops the
duplicates this creates. The number of settings each rule dropped is reported.

Example:
    >>> percentile_without_percentile_method(
    ...     {"calibrate_method": "MinMax", "extra_options.CalibPercentile": 99.9})
    ['extra_options.CalibPercentile']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "Rule",
    "RULES",
    "mixed_precision_without_promotion",
    "moving_average_constant_without_moving_average",
    "percentile_without_percentile_method",
]

Point = dict[str, Any]
Rule = Callable[[Point], list[str]]


def _keys(point: Point, leaf: str) -> list[str]:
    return [k for k in point if k.rsplit(".", 1)[-1] == leaf]


def _value(point: Point, leaf: str, default: Any = None) -> Any:
    keys = _keys(point, leaf)
    return point[keys[0]] if keys else default


def moving_average_constant_without_moving_average(point: Point) -> list[str]:
    """``CalibMovingAverageConstant`` only acts when ``CalibMovingAverage`` is true."""
    if _value(point, "CalibMovingAverage") is True:
        return []
    return _keys(point, "CalibMovingAverageConstant")


def percentile_without_percentile_method(point: Point) -> list[str]:
    """``CalibPercentile`` only acts with ``calibrate_method: Percentile``."""
    if _value(point, "calibrate_method") == "Percentile":
        return []
    return _keys(point, "CalibPercentile")


def mixed_precision_without_promotion(point: Point) -> list[str]:
    """``mixed_precision``: ``rank_<i>: int8`` beyond ``top_k`` is the default, and with
    nothing promoted (``top_k: 0``, no ``rank_<i>`` promoting) the other keys do nothing.

    Example:
        >>> mixed_precision_without_promotion({"mixed_precision.top_k": 0,
        ...     "mixed_precision.promote_to": "float", "mixed_precision.rank_3": "int8"})
        ['mixed_precision.promote_to', 'mixed_precision.rank_3']
    """
    prefix = "mixed_precision."
    keys = [k for k in point if k.startswith(prefix)]
    if not keys:
        return []
    top_k = point.get(prefix + "top_k") or 0
    strip = []
    promoting = top_k > 0
    for key in keys:
        leaf = key[len(prefix) :]
        if leaf.startswith("rank_") and leaf[5:].isdigit():
            if point[key] == "int8" and int(leaf[5:]) > top_k:
                strip.append(key)
            elif point[key] != "int8":
                promoting = True
    if not promoting:
        strip += [
            k
            for k in keys
            if k[len(prefix) :] in ("promote_to", "rank_by", "samples", "candidates")
        ]
    return sorted(set(strip), key=keys.index)


#: Every rule, in the order they are applied. A rule's name is its function name.
RULES: tuple[Rule, ...] = (
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
    mixed_precision_without_promotion,
)
