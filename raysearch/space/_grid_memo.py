"""What a grid's expansion memoises (private to :mod:`raysearch.space.space`): the keys the
validity rules strip from a point, once per distinct relevant sub-setting, and the identity a
grid de-duplicates points on, with each value encoded once."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from raysearch.space.rules import Rule

__all__ = ["_PointIdentity", "_Stripping"]

Point = dict[str, Any]


#: The value types a memoised rule may be keyed on: two equal values of one of these types
#: behave the same in every comparison a rule makes; other values call the rules.
_PLAIN_TYPES = frozenset({type(None), bool, int, float, str})


class _Stripping:
    """The keys ``rules`` strip from a point, memoised for one expansion on what the rules read
    (key names and read values with their types); rules without ``reads`` always run.
    """

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        tests = [getattr(rule, "reads", None) for rule in self.rules]
        self._tests: list[Callable[[str], bool]] | None = (
            None if any(test is None for test in tests) else tests
        )
        #: key names -> (the names among them whose values a rule reads, the memo by values)
        self._by_keys: dict[tuple[str, ...], tuple[tuple[str, ...], dict[tuple, frozenset]]] = {}

    def __call__(self, point: Point) -> frozenset[str]:
        if self._tests is None:
            return self._run(point)
        keys = tuple(point)
        entry = self._by_keys.get(keys)
        if entry is None:
            names = tuple(k for k in keys if any(test(k) for test in self._tests))
            entry = self._by_keys[keys] = (names, {})
        names, memo = entry
        values = tuple(map(point.__getitem__, names))
        types = tuple(map(type, values))
        if not _PLAIN_TYPES.issuperset(types):
            return self._run(point)
        gone = memo.get(values + types)
        if gone is None:
            gone = memo[values + types] = self._run(point)
        return gone

    def _run(self, point: Point) -> frozenset[str]:
        """The keys of ``point`` that :meth:`SearchSpace.canonical` with ``rules`` removes."""
        point = dict(point)
        gone = set()
        for rule in self.rules:
            for key in rule(point) or ():
                if key in point:
                    del point[key]
                    gone.add(key)
        return frozenset(gone)


class _PointIdentity:
    """The identity a grid de-duplicates points on: the sorted numbers of their
    ``(key, JSON of value)`` pairs (as canonical JSON would decide).

    Example:
        >>> identity = _PointIdentity()
        >>> identity({"a": 1, "b": [2]}) == identity({"b": [2], "a": 1})
        True
    """

    def __init__(self) -> None:
        #: (key, JSON of value) -> its number
        self._numbers: dict[tuple[str, str], int] = {}
        #: (key, id(value)) -> the number of (key, JSON of value), for the values ``_held``
        #: alive (so that an id names no other object while this lives).
        self._known: dict[tuple[str, int], int] = {}
        self._held: list[Any] = []

    def __call__(self, point: Point) -> tuple[int, ...]:
        try:
            return tuple(sorted(map(self._known.__getitem__, zip(point, map(id, point.values())))))
        except KeyError:  # a value met for the first time
            for key, value in point.items():
                if (key, id(value)) not in self._known:
                    text = json.dumps(value, sort_keys=True, default=str)
                    number = self._numbers.setdefault((key, text), len(self._numbers))
                    self._known[key, id(value)] = number
                    self._held.append(value)
            return self(point)
