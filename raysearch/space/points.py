"""``points_to_evaluate``: settings a search runs first, as Ray Tune's searchers call them.

A start point names parameters by dotted name or an unambiguous dotted suffix; what it leaves
out the searcher chooses.

Example:
    >>> space = SearchSpace.parse({
    ...     "quantizer": ["ort", "nncf"],
    ...     "nncf": {"only_if": {"quantizer": "nncf"}, "model_type": ["transformer", "none"]},
    ... })
    >>> resolve_point(space, {"quantizer": "nncf", "model_type": "transformer"})
    {'quantizer': 'nncf', 'nncf.model_type': 'transformer'}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.space.space import Point, SearchSpace
from raysearch.space.tree import Categorical, Param

__all__ = ["resolve_point", "resolve_points", "agrees", "first_agreeing", "fixed_space"]


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _given_key(param: Param, given: Mapping[str, Any]) -> str | None:
    """The key of ``given`` that names ``param``: its full name, else a dotted suffix of it."""
    if param.name in given:
        return param.name
    suffixes = [k for k in given if param.name.endswith("." + k)]
    return max(suffixes, key=len) if suffixes else None


def _check_value(param: Param, value: Any, where: str) -> Any:
    domain = param.domain
    if isinstance(domain, Categorical):
        for choice in domain.choices:
            # True == 1 in Python; a choice of true is not a choice of 1.
            if choice == value and isinstance(choice, bool) == isinstance(value, bool):
                return choice
        named = canonical_name(value, [c for c in domain.choices if isinstance(c, str)])
        if named is not None:
            return named
        shown = ", ".join(repr(c) for c in domain.choices)
        raise ConfigError(where, f"{value!r} is not one of the space's choices ({shown})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(where, f"expected a number in [{domain.low}, {domain.high}]")
    if not domain.low <= value <= domain.high:
        raise ConfigError(where, f"{value!r} is outside the space's range")
    return value


def resolve_point(space: SearchSpace, raw: Any, path: str = "points_to_evaluate[0]") -> Point:
    """``raw`` as a point of ``space``: full names, values checked, fixed settings filled in."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(path, "expected a mapping of parameters to values")
    given = _flatten(raw)
    point: Point = {}
    used: set[str] = set()
    for param in space.params:
        if not space.is_active(param, point):
            continue
        key = _given_key(param, given)
        if key is not None:
            point[param.name] = _check_value(param, given[key], f"{path}.{key}")
            used.add(key)
        elif isinstance(param.domain, Categorical) and param.domain.is_fixed:
            point[param.name] = param.domain.choices[0]
    unused = [k for k in given if k not in used]
    if unused:
        names = [p.name for p in space.params]
        inactive = [p for p in space.params if _given_key(p, {unused[0]: None})]
        why = (
            "is not active in this point (its group's only_if does not hold)"
            if inactive
            else "is not a parameter of the space" + suggest(unused[0], names)
        )
        raise ConfigError(f"{path}.{unused[0]}", why)
    return point


def resolve_points(space: SearchSpace, raws: Any, path: str = "points_to_evaluate") -> list[Point]:
    """Every point of the list ``raws`` resolved against ``space``."""
    if not isinstance(raws, list):
        raise ConfigError(path, "expected a list of settings to evaluate first")
    return [resolve_point(space, raw, f"{path}[{i}]") for i, raw in enumerate(raws)]


def agrees(point: Point, start: Point) -> bool:
    """Whether ``point`` has every value of the (maybe partial) ``start`` point."""
    return all(name in point and point[name] == value for name, value in start.items())


def first_agreeing(points: Sequence[Point], starts: Sequence[Point]) -> list[int]:
    """Indices of ``points`` in run order: the first agreeing with each start point, then the rest.

    Example:
        >>> first_agreeing([{"a": 1}, {"a": 2}, {"a": 3}], [{"a": 3}, {"a": 9}])
        [2, 0, 1]
    """
    order: list[int] = []
    for start in starts:
        match = next((i for i, p in enumerate(points) if i not in order and agrees(p, start)), None)
        if match is not None:
            order.append(match)
    return order + [i for i in range(len(points)) if i not in order]


def fixed_space(params: Mapping[str, Any]) -> dict[str, Any]:
    """A flat-dialect space with one choice per key of ``params`` (dotted paths nested back).

    Example:
        >>> fixed_space({"calibrate_method": "MinMax", "extra_options.WeightSymmetric": True})
        {'calibrate_method': ['MinMax'], 'extra_options': {'WeightSymmetric': [True]}}
    """
    space: dict[str, Any] = {}
    for name, value in params.items():
        parts = name.split(".")
        target = space
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = [copy.deepcopy(value)]
    return space
