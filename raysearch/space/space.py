"""``SearchSpace``: one parsed space with grid expansion, define-by-run sampling and the
conversion of a point into the nested settings a trial consumes."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raysearch.errors import ConfigError
from raysearch.space._grid_memo import _PointIdentity, _Stripping
from raysearch.space.catalogue import Catalogue
from raysearch.space.parse import parse_space
from raysearch.space.rules import RULES, Rule
from raysearch.space.tree import Categorical, Condition, FloatRange, Group, IntRange, Param

__all__ = ["SearchSpace", "Expansion", "Point", "Reject", "expand_spaces", "settings_key"]

_logger = logging.getLogger(__name__)

Point = dict[str, Any]
#: A check run on the nested settings of each grid point: the reason it cannot run, or None.
Reject = Callable[[dict[str, Any]], "str | None"]


@dataclass
class Expansion:
    """:meth:`SearchSpace.expand`'s points, their spaces, and the settings each rule dropped."""

    points: list[Point]
    total: int
    dropped: dict[str, int] = field(default_factory=dict)
    space_index: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.points)


class SettingWithoutItsSwitch:
    """Validity rule: a setting with ``requires=switch`` is stripped while its switch is off."""

    __name__ = "setting_without_its_switch"

    def __init__(self, switches: Mapping[str, str]) -> None:
        self.switches = dict(switches)

    def __call__(self, point: Point) -> list[str]:
        on = {k.rsplit(".", 1)[-1] for k, v in point.items() if v not in (None, False)}
        return [k for k, switch in self.switches.items() if k in point and switch not in on]

    def reads(self, key: str) -> bool:
        """The keys whose values the rule reads (``rules.reads``): the switches'."""
        return key.rsplit(".", 1)[-1] in self.switches.values()


#: Points and their identities, as two lists (fewer objects for the collector than pairs).
_Points = tuple[list[Point], list[tuple[int, ...]]]
#: Where a parameter's value goes in the settings: its container (None: the top level), the
#: setting names it sets and whether it is joint (one value per name).
_Placement = tuple["str | None", tuple[str, ...], bool]


def _placement(
    path: tuple[str, ...], joint: tuple[str, ...], containers: frozenset[str]
) -> _Placement:
    container = next((c for c in path[:-1] if c in containers), None)
    return container, joint or (path[-1],), bool(joint)


def settings_key(settings: Mapping[str, Any]) -> str:
    """The identity of a setting: its nested settings as canonical JSON (sorted keys)."""
    return json.dumps(settings, sort_keys=True, default=json_default)


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback: paths and numpy scalars as plain values, anything else as text."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


class SearchSpace:
    """A search space in either dialect, parsed and validated.

    Example:
        >>> space = SearchSpace.parse({
        ...     "calibrate_method": ["MinMax", "Percentile"],
        ...     "extra_options": {"CalibPercentile": [99.9, 99.99]},
        ... })
        >>> len(space.expand())   # MinMax once, Percentile twice
        3
        >>> space.to_settings({"calibrate_method": "MinMax"})
        {'calibrate_method': 'MinMax'}
    """

    def __init__(
        self,
        root: Group,
        *,
        name: str = "search_space",
        containers: frozenset[str] = frozenset({"extra_options"}),
        switches: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.name = name
        #: Keys whose settings stay nested (``extra_options``): the settings' containers.
        self.containers = containers
        #: Parameter name -> the switch key (``include_cle``) it only acts with.
        self.switches = dict(switches or {})
        self._conditions: dict[str, tuple[Condition, ...]] = {}
        self.params: tuple[Param, ...] = self._dependency_order()
        self.rules: tuple[Rule, ...] = RULES + (
            (SettingWithoutItsSwitch(self.switches),) if self.switches else ()
        )
        #: Points the searcher runs first (``raysearch.space.points``), maybe partial.
        self.points_to_evaluate: list[Point] = []

    @classmethod
    def parse(
        cls,
        raw: Mapping[str, Any],
        *,
        path: str = "search_space",
        catalogues: Mapping[str, Catalogue] | None = None,
    ) -> SearchSpace:
        """Parse ``raw`` and validate it against its backends' catalogues (default: all registered).

        Args:
            raw: the space in either dialect (README, "Search-space language").
            path: the key path its errors name.
            catalogues: the backends' settings catalogues to check it against.

        Returns:
            The :class:`SearchSpace`.
        """
        parsed = parse_space(raw, path=path, catalogues=catalogues)
        return cls(parsed.root, name=path, containers=parsed.containers, switches=parsed.switches)

    def _dependency_order(self) -> tuple[Param, ...]:
        """Parameters in declaration order, moved after the parameters their conditions read."""
        entries = list(self.root.walk())
        for p, conds in entries:
            self._conditions[p.name] = conds
        names = [p.name for p, _ in entries]
        deps = {p.name: {c.ref for c in conds} for p, conds in entries}
        ordered: list[str] = []
        done: set[str] = set()
        while len(ordered) < len(names):
            ready = [n for n in names if n not in done and deps[n] <= done]
            if not ready:
                cycle = sorted(n for n in names if n not in done)
                raise ConfigError(
                    self.name, f"only_if conditions form a cycle through {', '.join(cycle)}"
                )
            ordered.append(ready[0])
            done.add(ready[0])
        by_name = {p.name: p for p, _ in entries}
        return tuple(by_name[n] for n in ordered)

    def is_active(self, param: Param, point: Point) -> bool:
        """Whether every ``only_if`` around ``param`` holds for the values chosen so far."""
        return all(c.holds(point) for c in self._conditions[param.name])

    @property
    def has_ranges(self) -> bool:
        return any(isinstance(p.domain, (IntRange, FloatRange)) for p in self.params)

    def canonical(
        self, point: Point, rules: tuple[Rule, ...] | None = None
    ) -> tuple[Point, list[str]]:
        """``point`` without the keys the validity rules strip, and the rules that stripped."""
        rules = self.rules if rules is None else rules
        point = dict(point)
        fired: list[str] = []
        for rule in rules:
            stripped = rule(point)
            if stripped:
                fired.append(rule.__name__)
                for key in stripped:
                    point.pop(key, None)
        return point, fired

    def to_settings(self, point: Point) -> dict[str, Any]:
        """The nested settings of one point (DEVELOPERS.md, "A point and its settings")."""
        point, _ = self.canonical(point)
        return self._nest(point, self._placements())

    def _placements(self) -> dict[str, _Placement]:
        """Where each parameter's value goes in the settings (once per expansion)."""
        return {p.name: _placement(p.path, p.joint, self.containers) for p in self.params}

    def _nest(self, point: Point, placements: Mapping[str, _Placement]) -> dict[str, Any]:
        """The nested settings of a canonical ``point``."""
        settings: dict[str, Any] = {}
        for name, value in point.items():
            place = placements.get(name)
            if place is None:
                place = _placement(tuple(name.split(".")), (), self.containers)
            container, names, joint = place
            target = settings if container is None else settings.setdefault(container, {})
            if joint:
                for part, v in zip(names, value, strict=True):
                    target[part] = v
            else:
                target[names[0]] = value
        return settings

    def check_grid(self) -> None:
        """Raise if the space cannot be enumerated (a range somewhere)."""
        for p in self.params:
            if not isinstance(p.domain, Categorical):
                raise ConfigError(
                    f"{self.name}.{p.name}",
                    "Grid search needs a list of choices; this is a range "
                    "(use a list, or a sampler such as TPE or Random)",
                )

    def expand(self, reject: Reject | None = None) -> Expansion:
        """The grid: active combinations, rules applied, refusals and duplicates dropped."""
        return self._expand(reject)[0]

    def _expand(self, reject: Reject | None, keyed: bool = False) -> tuple[Expansion, list[str]]:
        """:meth:`expand`, with each point's :func:`settings_key` when ``keyed``."""
        self.check_grid()
        dropped: dict[str, int] = {}
        raw = self._enumerate()
        identity = _PointIdentity()
        # Rules are applied one at a time, de-duplicating after each: a setting is credited to
        # the rule whose stripping first made it a copy of one already kept.
        grid = self._dedupe((raw, [identity(p) for p in raw]), "duplicate", dropped)
        for rule in self.rules:
            stripping = _Stripping((rule,))
            grid = self._dedupe(self._strip(grid, stripping, identity), rule.__name__, dropped)
        points = grid[0]
        keys: list[str] = []
        if reject is not None or keyed:
            points, keys = self._check(points, reject, keyed, dropped)
        for name, count in dropped.items():
            _logger.info("%s: %s dropped %d of %d settings", self.name, name, count, len(raw))
        return Expansion(points, len(raw), dropped), keys

    @staticmethod
    def _strip(grid: _Points, stripping: _Stripping, identity: _PointIdentity) -> _Points:
        """Each point as ``canonical`` with ``stripping`` makes it (unchanged: the same object)."""
        points, idents = [], []
        for point, ident in zip(*grid):
            gone = stripping(point)
            if gone:
                point = {k: v for k, v in point.items() if k not in gone}
                ident = identity(point)
            points.append(point)
            idents.append(ident)
        return points, idents

    @staticmethod
    def _dedupe(grid: _Points, reason: str, dropped: dict[str, int]) -> _Points:
        """The first point of each identity; the others counted under ``reason``."""
        seen: set[tuple[int, ...]] = set()
        points, idents = [], []
        for point, ident in zip(*grid):
            if ident in seen:
                dropped[reason] = dropped.get(reason, 0) + 1
            else:
                seen.add(ident)
                points.append(point)
                idents.append(ident)
        return points, idents

    def _check(
        self,
        points: list[Point],
        reject: Reject | None,
        keyed: bool,
        dropped: dict[str, int],
    ) -> tuple[list[Point], list[str]]:
        """The points ``reject`` does not refuse, keyed when ``keyed``."""
        placements = self._placements()
        stripping = _Stripping(self.rules)
        kept: list[Point] = []
        keys: list[str] = []
        for point in points:
            gone = stripping(point)  # canonical(point)[0], built only where it differs
            canonical_point = {k: v for k, v in point.items() if k not in gone} if gone else point
            settings = self._nest(canonical_point, placements)
            key = settings_key(settings) if keyed else ""
            reason = reject(settings) if reject is not None else None
            if reason:
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            kept.append(point)
            if keyed:
                keys.append(key)
        return kept, keys

    def _enumerate(self) -> list[Point]:
        """Every combination of the active parameters' choices, the first varying slowest."""
        points: list[Point] = [{}]
        for param in self.params:
            name, choices = param.name, param.domain.choices
            conditions = self._conditions[name]  # is_active's, looked up once per parameter
            grown: list[Point] = []
            for point in points:
                if conditions and not all(c.holds(point) for c in conditions):
                    grown.append(point)
                elif len(choices) == 1:  # each partial point is one entry's: set in place
                    point[name] = choices[0]
                    grown.append(point)
                else:
                    grown.extend([{**point, name: choice} for choice in choices])
            points = grown
        return points

    def grid_size(self) -> int:
        """The number of raw combinations before rules and de-duplication."""
        # Counted without listing them: a partial point keeps the values only_if reads, with
        # the number of combinations it stands for.
        refs = {c.ref for conds in self._conditions.values() for c in conds}
        partial: list[tuple[Point, int]] = [({}, 1)]
        for param in self.params:
            grown: list[tuple[Point, int]] = []
            for point, count in partial:
                if not self.is_active(param, point):
                    grown.append((point, count))
                elif param.name in refs:
                    grown.extend(({**point, param.name: c}, count) for c in param.domain.choices)
                else:
                    grown.append((point, count * len(param.domain.choices)))
            partial = grown
        return sum(count for _, count in partial)

    def sample(self, trial: Any) -> Point:
        """Optuna define-by-run function: suggest the active parameters in dependency order and
        return the full point, as Ray Tune's ``OptunaSearch`` expects.
        """
        point: Point = {}
        for param in self.params:
            if not self.is_active(param, point):
                continue
            domain = param.domain
            if isinstance(domain, Categorical):
                if domain.is_fixed:
                    point[param.name] = domain.choices[0]
                else:
                    label = trial.suggest_categorical(param.name, list(domain.labels))
                    point[param.name] = domain.from_label(label)
            elif isinstance(domain, IntRange):
                point[param.name] = trial.suggest_int(
                    param.name, domain.low, domain.high, step=domain.step, log=domain.log
                )
            else:
                point[param.name] = trial.suggest_float(
                    param.name, domain.low, domain.high, step=domain.step, log=domain.log
                )
        return point


def expand_spaces(spaces: Sequence[SearchSpace], reject: Reject | None = None) -> Expansion:
    """The grid of several spaces searched in order, a setting an earlier space has dropped as
    ``duplicate``: what a Grid search runs and ``validate``/``spaces`` count.

    Args:
        spaces: the spaces, in order (``StrategyContext.spaces``).
        reject: why a point's settings are refused, or None (``StrategyContext.reject``).

    Returns:
        The :class:`Expansion`.

    Example:
        >>> a = SearchSpace.parse({"per_channel": [True, False]}, path="a")
        >>> b = SearchSpace.parse({"per_channel": [False], "reduce_range": [True]}, path="b")
        >>> grid = expand_spaces([a, b, a])
        >>> len(grid), grid.space_index, grid.dropped
        (3, [0, 0, 1], {'duplicate': 2})
    """
    seen: set[str] = set()
    out = Expansion([], 0, {})
    for index, space in enumerate(spaces):
        expansion, keys = space._expand(reject, keyed=True)
        out.total += expansion.total
        for name, count in expansion.dropped.items():
            out.dropped[name] = out.dropped.get(name, 0) + count
        for point, key in zip(expansion.points, keys, strict=True):
            if key in seen:
                out.dropped["duplicate"] = out.dropped.get("duplicate", 0) + 1
                continue
            seen.add(key)
            out.points.append(point)
            out.space_index.append(index)
    return out
