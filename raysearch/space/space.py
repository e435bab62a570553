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
    """The result of :meth:`SearchSpace.expand` (or :func:`expand_spaces`): the points to run,
    in order, the index of the space each came from, and how many settings each validity rule,
    backend refusal and plain duplication dropped."""

    points: list[Point]
    total: int
    dropped: dict[str, int] = field(default_factory=dict)
    space_index: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.points)


class SettingWithoutItsSwitch:
    """Validity rule: a setting declared with ``OptionSpec(requires=switch)`` is meaningless
    (and stripped) while its switch is off or absent. A class, not a closure: a space travels
    to Ray Tune's searcher by pickle."""

    __name__ = "setting_without_its_switch"

    def __init__(self, switches: Mapping[str, str]) -> None:
        self.switches = dict(switches)

    def __call__(self, point: Point) -> list[str]:
        on = {k.rsplit(".", 1)[-1] for k, v in point.items() if v not in (None, False)}
        return [k for k, switch in self.switches.items() if k in point and switch not in on]


def _key(point: Point) -> str:
    return json.dumps(point, sort_keys=True, default=str)


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
        self.rules: tuple[Rule, ...] = RULES + ((self._switch_rule(),) if self.switches else ())
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
        """Parse ``raw`` and validate it against the catalogues of its backends (default:
        every registered backend's)."""
        parsed = parse_space(raw, path=path, catalogues=catalogues)
        return cls(parsed.root, name=path, containers=parsed.containers, switches=parsed.switches)

    def _switch_rule(self) -> Rule:
        """The validity rule for settings declared with ``OptionSpec.requires``."""
        return SettingWithoutItsSwitch(self.switches)

    # -- structure -------------------------------------------------------------------------
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

    # -- canonical points and settings -----------------------------------------------------
    def canonical(
        self, point: Point, rules: tuple[Rule, ...] | None = None
    ) -> tuple[Point, list[str]]:
        """Return ``point`` with the keys that validity rules call meaningless stripped, and the
        names of the rules that stripped something."""
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
        """Nested quantization settings for one sampled point: group names removed (containers
        such as ``extra_options`` kept), joint parameters split, meaningless keys stripped."""
        point, _ = self.canonical(point)
        settings: dict[str, Any] = {}
        params = {p.name: p for p in self.params}
        for name, value in point.items():
            param = params.get(name)
            path = param.path if param else tuple(name.split("."))
            containers = [c for c in path[:-1] if c in self.containers]
            target = settings
            for c in containers[:1]:
                target = target.setdefault(c, {})
            joint = param.joint if param else ()
            if joint:
                for part, v in zip(joint, value, strict=True):
                    target[part] = v
            else:
                target[path[-1]] = value
        return settings

    # -- grid ------------------------------------------------------------------------------
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
        """All settings of the space for grid search: the cartesian product over active groups
        only, with validity rules applied and duplicates removed, in declaration order.

        ``reject`` is an extra check on each point's nested settings (a backend's list of
        combinations it refuses); it is counted like a rule under the name it returns.
        """
        self.check_grid()
        dropped: dict[str, int] = {}
        raw = list(self._enumerate(0, {}))
        # Rules are applied one at a time, de-duplicating after each: a setting is credited to
        # the rule whose stripping first made it a copy of one already kept.
        points = self._dedupe(raw, "duplicate", dropped)
        for rule in self.rules:
            points = self._dedupe(
                [self.canonical(p, (rule,))[0] for p in points], rule.__name__, dropped
            )
        if reject is not None:
            kept = []
            for point in points:
                reason = reject(self.to_settings(point))
                if reason:
                    dropped[reason] = dropped.get(reason, 0) + 1
                else:
                    kept.append(point)
            points = kept
        for name, count in dropped.items():
            _logger.info("%s: %s dropped %d of %d settings", self.name, name, count, len(raw))
        return Expansion(points, len(raw), dropped)

    @staticmethod
    def _dedupe(points: list[Point], reason: str, dropped: dict[str, int]) -> list[Point]:
        seen: set[str] = set()
        out = []
        for point in points:
            key = _key(point)
            if key in seen:
                dropped[reason] = dropped.get(reason, 0) + 1
            else:
                seen.add(key)
                out.append(point)
        return out

    def _enumerate(self, i: int, point: Point):
        if i == len(self.params):
            yield dict(point)
            return
        param = self.params[i]
        if not self.is_active(param, point):
            yield from self._enumerate(i + 1, point)
            return
        for choice in param.domain.choices:
            point[param.name] = choice
            yield from self._enumerate(i + 1, point)
        del point[param.name]

    def grid_size(self) -> int:
        """The number of raw combinations before rules and de-duplication."""
        return sum(1 for _ in self._enumerate(0, {}))

    # -- define-by-run ---------------------------------------------------------------------
    def sample(self, trial: Any) -> Point:
        """Optuna define-by-run function: suggest only active, searched parameters, in
        dependency order, and return the full point (fixed settings included, and the real
        values of choices Optuna only sees as labels), as Ray Tune's ``OptunaSearch`` expects.

        Example:
            >>> import optuna
            >>> space = SearchSpace.parse({"per_channel": [True, False], "reduce_range": [False]})
            >>> study = optuna.create_study()
            >>> sorted(space.sample(study.ask()))
            ['per_channel', 'reduce_range']
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
    """The grid of several spaces searched in order: each space expanded with the validity rules
    and ``reject``, and a setting an earlier space already has dropped as ``duplicate``. This is
    exactly what a Grid search runs, so ``raysearch validate`` and ``raysearch spaces`` count
    with it too.

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
        expansion = space.expand(reject=reject)
        out.total += expansion.total
        for name, count in expansion.dropped.items():
            out.dropped[name] = out.dropped.get(name, 0) + count
        for point in expansion.points:
            key = settings_key(space.to_settings(point))
            if key in seen:
                out.dropped["duplicate"] = out.dropped.get("duplicate", 0) + 1
                continue
            seen.add(key)
            out.points.append(point)
            out.space_index.append(index)
    return out
