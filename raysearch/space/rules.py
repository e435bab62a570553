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
    "JOINT_PARAMETERS",
    "FINETUNE_PARAMETERS",
    "moving_average_constant_without_moving_average",
    "percentile_without_percentile_method",
    "smoothquant_alpha_without_smoothquant",
    "finetune_params_without_finetune",
    "joint_and_split_together",
]

Point = dict[str, Any]
Rule = Callable[[Point], list[str]]

#: Joint parameters: one choice sets several settings at once.
JOINT_PARAMETERS: dict[str, tuple[str, ...]] = {"NumIterLR": ("NumIterations", "LearningRate")}

#: Settings that only mean something when layer-wise fine-tuning (AdaRound, AdaQuant) is on.
FINETUNE_PARAMETERS = frozenset(
    {"NumIterations", "LearningRate", "NumIterLR", "num_iterations", "learning_rate"}
)
_FINETUNE_SWITCHES = ("algorithm", "FastFinetune", "finetune")


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


def smoothquant_alpha_without_smoothquant(point: Point) -> list[str]:
    """``SmoothQuantAlpha`` and ``SmoothQuantFolding`` only act when ``SmoothQuant`` is true."""
    if _value(point, "SmoothQuant") is True:
        return []
    return _keys(point, "SmoothQuantAlpha") + _keys(point, "SmoothQuantFolding")


def _finetune_on(point: Point) -> bool:
    for switch in _FINETUNE_SWITCHES:
        value = _value(point, switch)
        if value not in (None, False, "none", "None", ""):
            return True
    return False


def finetune_params_without_finetune(point: Point) -> list[str]:
    """Fine-tuning iterations and learning rate only act when fine-tuning is switched on
    (``algorithm`` other than ``none``, or ``FastFinetune``/``finetune`` set)."""
    if _finetune_on(point):
        return []
    return [k for k in point if k.rsplit(".", 1)[-1] in FINETUNE_PARAMETERS]


def joint_and_split_together(point: Point) -> list[str]:
    """A joint parameter (``NumIterLR``) and the settings it splits into (``NumIterations``,
    ``LearningRate``) set together: the joint one wins, the split ones are meaningless."""
    stripped: list[str] = []
    for joint, parts in JOINT_PARAMETERS.items():
        if _keys(point, joint):
            for part in parts:
                stripped += _keys(point, part)
    return stripped


#: Every rule, in the order they are applied. A rule's name is its function name.
RULES: tuple[Rule, ...] = (
    joint_and_split_together,
    finetune_params_without_finetune,
    moving_average_constant_without_moving_average,
    percentile_without_percentile_method,
    smoothquant_alpha_without_smoothquant,
)
