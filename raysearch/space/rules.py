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


#: Every rule, in the order they are applied. A rule's name is its function name.
RULES: tuple[Rule, ...] = (
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
)
