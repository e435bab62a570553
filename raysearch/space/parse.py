"""Parse both search-space dialects into one :mod:`~raysearch.space.tree`.

Flat dialect: nested dicts of lists. Each key's list holds its choices; a nested dict is a group
whose keys vary independently; a single-choice list (or a bare scalar) is a fixed setting.

Conditional dialect: the same, plus groups holding ``only_if`` (active only when the condition
holds), ranges ``{type: int|float, low, high, step?, log?}``, explicit choices
``{type: categorical, choices: [...]}`` and joint parameters
(``{joint: [a, b], choices: [[...], ...]}``: one choice sets several settings).

Every key and value (each part of a joint parameter included) is checked against the settings
catalogue of :mod:`raysearch.quantize.options`; unknown keys get the closest known key as a
suggestion, and keys that name a technique raysearch does not have yet are refused with why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from raysearch.errors import ConfigError, suggest
from raysearch.quantize.options import (
    EXTRA_OPTIONS,
    SETTINGS,
    OptionSpec,
    canonical_name,
    check_value,
    unavailable_reason,
)
from raysearch.space.tree import (
    Categorical,
    Condition,
    FloatRange,
    Group,
    IntRange,
    Param,
)

__all__ = ["parse_space", "CONTAINERS"]

#: Keys whose dict is a container of settings (kept in the nested settings), not a group.
CONTAINERS: dict[str, dict[str, OptionSpec]] = {"extra_options": EXTRA_OPTIONS}
_RANGE_KEYS = {"type", "low", "high", "step", "log"}
_SPEC_KEYS = {"type", "choices", "joint"}


def parse_space(raw: Any, *, path: str = "search_space") -> Group:
    """Parse one space (a dict in either dialect) into its tree, validating it completely."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected a mapping of settings, got {_kind(raw)}")
    if not raw:
        raise ConfigError(path, "the search space is empty")
    if "only_if" in raw:
        raise ConfigError(f"{path}.only_if", "only_if belongs in a group, not at the top level")
    root = _Parser(path).group(raw, (), container="")
    return _resolve_conditions(root, path)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class _Parser:
    def __init__(self, path: str) -> None:
        self.base = path

    def where(self, keys: tuple[str, ...]) -> str:
        return ".".join((self.base,) + keys)

    def group(self, raw: Mapping, keys: tuple[str, ...], container: str) -> Group:
        params: list[Param] = []
        groups: list[Group] = []
        condition = None
        for key, value in raw.items():
            if not isinstance(key, str):
                raise ConfigError(self.where(keys), f"keys must be strings, got {key!r}")
            if key == "only_if":
                condition = self.condition(value, keys + (key,))
                continue
            self.check_available(key, self.where(keys + (key,)))
            if key in CONTAINERS and container == "":
                if not isinstance(value, Mapping):
                    raise ConfigError(
                        self.where(keys + (key,)), f"expected a mapping, got {_kind(value)}"
                    )
                groups.append(self.group(value, keys + (key,), container=key))
            elif isinstance(value, Mapping) and not (_SPEC_KEYS & value.keys()):
                self.check_group_name(key, keys, container)
                groups.append(self.group(value, keys + (key,), container=container))
            else:
                params.append(self.param(key, value, keys, container))
        if not params and not groups:
            raise ConfigError(self.where(keys), "the group is empty")
        return Group(keys, tuple(params), tuple(groups), None if condition is None else condition)

    def condition(self, value: Any, keys: tuple[str, ...]) -> Condition:
        if isinstance(value, str):
            return Condition(value, None)
        if isinstance(value, Mapping) and len(value) == 1:
            ((ref, want),) = value.items()
            values = tuple(want) if isinstance(want, list) else (want,)
            if not values:
                raise ConfigError(self.where(keys + (str(ref),)), "the list of values is empty")
            return Condition(str(ref), values)
        raise ConfigError(
            self.where(keys),
            "expected a key name or a mapping of one key to its value(s), e.g. "
            "{calibrate_method: Percentile}",
        )

    @staticmethod
    def check_available(key: str, where: str) -> None:
        reason = unavailable_reason(key)
        if reason:
            raise ConfigError(where, reason)

    def check_group_name(self, key: str, keys: tuple[str, ...], container: str) -> None:
        catalogue = self.catalogue(container)
        if key in catalogue and catalogue[key].kind != "dict":
            raise ConfigError(
                self.where(keys + (key,)),
                f"expected a list of choices or a range for '{key}', got a mapping",
            )

    def catalogue(self, container: str) -> dict[str, OptionSpec]:
        return CONTAINERS.get(container, SETTINGS)

    def param(self, key: str, value: Any, keys: tuple[str, ...], container: str) -> Param:
        name = canonical_name(container, key)
        where = self.where(keys + (key,))
        joint: tuple[str, ...] = ()
        if isinstance(value, Mapping):
            domain, joint = self.spec(value, where)
            joint = tuple(canonical_name(container, part) for part in joint)
        elif isinstance(value, list):
            if not value:
                raise ConfigError(where, "the list of choices is empty")
            domain = Categorical(tuple(value))
        else:
            domain = Categorical((value,))
        if joint:
            self.check_joint(domain, joint, keys, container, where)
        else:
            self.check_known(name, key, keys, container, where)
            self.check_choices(self.catalogue(container)[name], name, domain, where)
        return Param(keys + (name,), domain, joint)

    def spec(self, value: Mapping, where: str):
        kind = value.get("type", "categorical" if "choices" in value else None)
        if "joint" in value:
            joint = value["joint"]
            if not (
                isinstance(joint, list)
                and len(joint) >= 2
                and all(isinstance(j, str) for j in joint)
            ):
                raise ConfigError(f"{where}.joint", "expected a list of two or more key names")
            kind = "categorical"
        else:
            joint = ()
        if kind == "categorical":
            unknown = set(value) - {"type", "choices", "joint"}
            if unknown:
                raise ConfigError(where, f"unknown key '{sorted(unknown)[0]}' in a choices block")
            choices = value.get("choices")
            if not isinstance(choices, list):
                raise ConfigError(f"{where}.choices", "expected a list of choices")
            if not choices:
                raise ConfigError(f"{where}.choices", "the list of choices is empty")
            return Categorical(tuple(choices)), tuple(joint)
        if kind not in ("int", "float"):
            raise ConfigError(
                f"{where}.type",
                f"expected int, float or categorical, got {kind!r}"
                if kind is not None
                else "a mapping here needs type: int|float|categorical (or is a group of keys)",
            )
        unknown = set(value) - _RANGE_KEYS
        if unknown:
            bad = sorted(unknown)[0]
            raise ConfigError(
                f"{where}.{bad}", "unknown key in a range" + suggest(bad, _RANGE_KEYS)
            )
        for bound in ("low", "high"):
            if bound not in value:
                raise ConfigError(where, f"a {kind} range needs '{bound}'")
            v = value[bound]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{where}.{bound}", f"expected a number, got {v!r}")
        low, high, step, log = (
            value["low"],
            value["high"],
            value.get("step"),
            value.get("log", False),
        )
        if low > high:
            raise ConfigError(where, f"low ({low}) is greater than high ({high})")
        if not isinstance(log, bool):
            raise ConfigError(f"{where}.log", f"expected true or false, got {log!r}")
        if log and low <= 0:
            raise ConfigError(f"{where}.low", "a log range needs low > 0")
        if step is not None and (
            isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0
        ):
            raise ConfigError(f"{where}.step", f"expected a positive number, got {step!r}")
        if log and step is not None:
            raise ConfigError(where, "a range cannot have both step and log")
        if kind == "int":
            for bound, v in (("low", low), ("high", high), ("step", step)):
                if v is not None and not float(v).is_integer():
                    raise ConfigError(f"{where}.{bound}", f"expected an integer, got {v!r}")
            return IntRange(int(low), int(high), int(step or 1), log), ()
        return FloatRange(float(low), float(high), None if step is None else float(step), log), ()

    def check_joint(
        self, domain, joint: tuple[str, ...], keys: tuple[str, ...], container: str, where: str
    ) -> None:
        """Each part of a joint parameter is a known setting and each value fits its part."""
        if not isinstance(domain, Categorical):
            raise ConfigError(where, "a joint parameter needs a list of choices")
        if len(set(joint)) != len(joint):
            raise ConfigError(f"{where}.joint", f"names a setting twice: {', '.join(joint)}")
        catalogue = self.catalogue(container)
        for part in joint:
            self.check_available(part, f"{where}.joint.{part}")
            self.check_known(part, part, keys, container, f"{where}.joint.{part}")
        for i, choice in enumerate(domain.choices):
            if not isinstance(choice, list) or len(choice) != len(joint):
                raise ConfigError(
                    where,
                    f"each choice of a joint parameter sets {', '.join(joint)}: expected a list "
                    f"of {len(joint)} values, got {choice!r}",
                )
            for part, value in zip(joint, choice):
                problem = check_value(catalogue[part], value)
                if problem:
                    raise ConfigError(f"{where}.choices[{i}]", f"{part}: {problem}")

    def check_known(self, name: str, key: str, keys, container: str, where: str) -> None:
        catalogue = self.catalogue(container)
        if name in catalogue and catalogue[name].kind != "dict":
            return
        if name in catalogue:  # extra_options given as a list or scalar
            raise ConfigError(where, f"expected a mapping of {name} keys, got a list or value")
        hint = suggest(key, catalogue)
        if not hint:
            for other, other_catalogue in (("extra_options", EXTRA_OPTIONS), ("", SETTINGS)):
                if other != container and canonical_name(other, key) in other_catalogue:
                    hint = (
                        f" ('{key}' is an extra_options key: put it under extra_options)"
                        if other
                        else f" ('{key}' is a top-level setting, not an extra_options key)"
                    )
                    break
        raise ConfigError(where, "unknown key" + hint)

    def check_choices(self, spec: OptionSpec, name: str, domain, where: str) -> None:
        if isinstance(domain, (IntRange, FloatRange)):
            if spec.kind not in ("int", "float"):
                raise ConfigError(where, f"a numeric range does not fit '{name}' ({spec.doc})")
            if spec.kind == "int" and isinstance(domain, FloatRange):
                raise ConfigError(where, f"'{name}' is an integer setting: use type: int")
            for bound in (domain.low, domain.high):
                problem = check_value(spec, bound)
                if problem:
                    raise ConfigError(where, problem)
            return
        for i, choice in enumerate(domain.choices):
            if spec.kind == "str_list" and isinstance(choice, str):
                raise ConfigError(
                    f"{where}[{i}]",
                    f"each choice of {name} is a list of names or null, got {choice!r} "
                    f"(write [[{choice}, ...]] for a single choice)",
                )
            problem = check_value(spec, choice)
            if problem:
                raise ConfigError(f"{where}[{i}]" if len(domain.choices) > 1 else where, problem)


def _resolve_conditions(root: Group, base: str) -> Group:
    """Point each ``only_if`` at the full key path of the parameter it names; check that it
    exists, is unambiguous, can take the values asked for, and that conditions have no cycle."""
    params = {p.name: p for p, _ in root.walk()}
    by_leaf: dict[str, list[str]] = {}
    for name, p in params.items():
        by_leaf.setdefault(p.leaf, []).append(name)

    def resolve(group: Group) -> Group:
        cond = group.condition
        if cond is not None:
            where = ".".join((base,) + group.path + ("only_if",))
            if cond.ref in params:
                ref = cond.ref
            elif len(by_leaf.get(cond.ref, [])) == 1:
                ref = by_leaf[cond.ref][0]
            elif cond.ref in by_leaf:
                raise ConfigError(
                    where,
                    f"'{cond.ref}' is ambiguous: write one of {', '.join(by_leaf[cond.ref])}",
                )
            else:
                raise ConfigError(
                    where, f"refers to unknown key '{cond.ref}'" + suggest(cond.ref, params)
                )
            if ref.split(".")[:-1] == list(group.path) or ref.startswith(
                ".".join(group.path) + "."
            ):
                raise ConfigError(where, f"a group cannot depend on its own key '{ref}'")
            domain = params[ref].domain
            if cond.values is not None and isinstance(domain, Categorical):
                missing = [v for v in cond.values if v not in domain.choices]
                if missing:
                    raise ConfigError(
                        where,
                        f"'{ref}' never takes the value {missing[0]!r} "
                        f"(its choices: {', '.join(map(str, domain.choices))})",
                    )
            cond = Condition(ref, cond.values)
        return Group(group.path, group.params, tuple(resolve(g) for g in group.groups), cond)

    return resolve(root)
