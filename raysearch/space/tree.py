"""The internal tree both search-space dialects are parsed into.

A space is a :class:`Group` (the root) holding parameters and nested groups; a group may carry
a :class:`Condition` (``only_if``) that must hold for any of its parameters to be active.
Each parameter has a domain: :class:`Categorical` choices or an :class:`IntRange` /
:class:`FloatRange`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Categorical",
    "IntRange",
    "FloatRange",
    "Domain",
    "Param",
    "Condition",
    "Group",
    "PRIMITIVE_TYPES",
]

PRIMITIVE_TYPES = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Categorical:
    """A list of choices; a single choice is a fixed setting."""

    choices: tuple[Any, ...]

    @property
    def is_fixed(self) -> bool:
        return len(self.choices) == 1

    @property
    def labels(self) -> tuple[Any, ...]:
        """Optuna-compatible stand-ins: the choices, or their JSON text where not primitive."""
        if all(isinstance(c, PRIMITIVE_TYPES) for c in self.choices):
            return self.choices
        return tuple(json.dumps(c) for c in self.choices)

    def from_label(self, label: Any) -> Any:
        if self.labels is self.choices:
            return label
        return self.choices[self.labels.index(label)]


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1
    log: bool = False
    is_fixed = False


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    step: float | None = None
    log: bool = False
    is_fixed = False


Domain = Categorical | IntRange | FloatRange


@dataclass(frozen=True)
class Param:
    """One searched key at ``path``; ``joint`` names the settings a joint parameter sets."""

    path: tuple[str, ...]
    domain: Domain
    joint: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def leaf(self) -> str:
        return self.path[-1]


@dataclass(frozen=True)
class Condition:
    """``only_if``: active when ``ref`` is active with one of ``values`` (None: truthy)."""

    ref: str
    values: tuple[Any, ...] | None

    def holds(self, point: dict[str, Any]) -> bool:
        if self.ref not in point:
            return False
        value = point[self.ref]
        if self.values is None:
            return bool(value) and value != "none"
        return value in self.values


@dataclass(frozen=True)
class Group:
    path: tuple[str, ...]
    params: tuple[Param, ...]
    groups: tuple[Group, ...]
    condition: Condition | None = None

    def walk(self, conditions: tuple[Condition, ...] = ()):
        """Yield ``(param, conditions)`` for every parameter, with its groups' conditions."""
        conds = conditions + ((self.condition,) if self.condition else ())
        for p in self.params:
            yield p, conds
        for g in self.groups:
            yield from g.walk(conds)
