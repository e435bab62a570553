"""Parse both search-space dialects into one :mod:`~raysearch.space.tree`.

Flat: nested dicts of lists (a list's choices; a nested dict a group; a scalar fixed).
Conditional: the same, plus ``only_if`` groups, ranges ``{type, low, high, step?, log?}``,
``{type: categorical, choices}`` and joint parameters ``{joint: [a, b], choices}``. Keys and
values are checked against the catalogue of each backend they can be active with.

Example:
    >>> parsed = parse_space({"per_channel": [True, False], "quantizer": "ort"})
    >>> [p.name for p in parsed.root.params]
    ['per_channel', 'quantizer']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raysearch.errors import ConfigError, ErrorCollector, canonical_name, suggest
from raysearch.space._schema import QUANTIZER_KEY, Schema
from raysearch.space.catalogue import Catalogue, registered_catalogues
from raysearch.space.tree import (
    Categorical,
    Condition,
    Domain,
    FloatRange,
    Group,
    IntRange,
    Param,
)

__all__ = ["parse_space", "Parsed"]

_RANGE_KEYS = {"type", "low", "high", "step", "log"}
_SPEC_KEYS = {"type", "choices", "joint"}


@dataclass(frozen=True)
class Parsed:
    """A parsed space: its tree, its container keys and the switch each setting acts with."""

    root: Group
    containers: frozenset[str]
    switches: dict[str, str]


def parse_space(
    raw: Any, *, path: str = "search_space", catalogues: Mapping[str, Catalogue] | None = None
) -> Parsed:
    """Parse one space into its tree, validated against ``catalogues`` (default: all)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected a mapping of settings, got {_kind(raw)}")
    if not raw:
        raise ConfigError(path, "the search space is empty")
    if "only_if" in raw:
        raise ConfigError(f"{path}.only_if", "only_if belongs in a group, not at the top level")
    schema = Schema(registered_catalogues() if catalogues is None else catalogues)
    parser = _Parser(path, schema)
    backends = parser.quantizer_choices(raw, ())
    root = parser.group(raw, (), "", backends or schema.default_backends())
    containers = frozenset(schema.containers(backends or schema.default_backends()))
    return Parsed(_resolve_conditions(root, path), containers, parser.switches)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class _Parser:
    def __init__(self, path: str, schema: Schema) -> None:
        self.base = path
        self.schema = schema
        #: param name -> the switch key it only acts with
        self.switches: dict[str, str] = {}

    def where(self, keys: tuple[str, ...]) -> str:
        return ".".join((self.base,) + keys)

    def quantizer_choices(self, raw: Mapping, keys: tuple[str, ...]) -> tuple[str, ...]:
        """Every backend the space's ``quantizer`` keys may select (in groups too), checked."""
        found: list[str] = []
        for key, value in raw.items():
            if key == QUANTIZER_KEY:
                where = self.where(keys + (key,))
                found += self.schema.backend_choices(_literal_choices(value, where), where)
            elif isinstance(value, Mapping) and key != "only_if" and not _SPEC_KEYS & value.keys():
                found += self.quantizer_choices(value, keys + (key,))
        return tuple(dict.fromkeys(found))

    @staticmethod
    def narrowed(condition: Condition | None, backends: tuple[str, ...]) -> tuple[str, ...]:
        """The backends a group is active with: ``only_if: {quantizer: ...}`` narrows them."""
        if condition is None or condition.values is None:
            return backends
        if condition.ref.rsplit(".", 1)[-1] != QUANTIZER_KEY:
            return backends
        wanted = {canonical_name(v, backends) or v for v in condition.values}
        return tuple(b for b in backends if b in wanted)

    def group(
        self, raw: Mapping, keys: tuple[str, ...], container: str, backends: tuple[str, ...]
    ) -> Group:
        condition = None
        if "only_if" in raw:
            condition = self.condition(raw["only_if"], keys + ("only_if",))
            backends = self.narrowed(condition, backends) or backends
        params: list[Param] = []
        groups: list[Group] = []
        errors = ErrorCollector()  # every entry's mistake, one line each
        for key, value in raw.items():
            if key == "only_if":
                continue
            with errors.check():
                entry = self.entry(key, value, keys, container, backends)
                (groups if isinstance(entry, Group) else params).append(entry)
        errors.raise_any()
        if not params and not groups:
            raise ConfigError(self.where(keys), "the group is empty")
        return Group(keys, tuple(params), tuple(groups), condition)

    def entry(
        self,
        key: Any,
        value: Any,
        keys: tuple[str, ...],
        container: str,
        backends: tuple[str, ...],
    ) -> Param | Group:
        """One key of a group: a container, a nested group or a parameter."""
        if not isinstance(key, str):
            raise ConfigError(self.where(keys), f"keys must be strings, got {key!r}")
        where = self.where(keys + (key,))
        self.schema.check_available(key, backends, where)
        if container == "" and key in self.schema.containers(backends):
            if not isinstance(value, Mapping):
                raise ConfigError(where, f"expected a mapping, got {_kind(value)}")
            return self.group(value, keys + (key,), key, backends)
        if isinstance(value, Mapping) and not (_SPEC_KEYS & value.keys()):
            self.schema.check_group_name(key, container, backends, where)
            return self.group(value, keys + (key,), container, backends)
        return self.param(key, value, keys, container, backends)

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

    def param(
        self,
        key: str,
        value: Any,
        keys: tuple[str, ...],
        container: str,
        backends: tuple[str, ...],
    ) -> Param:
        where = self.where(keys + (key,))
        name = self.schema.canonical(container, key, backends, where)
        joint: tuple[str, ...] = ()
        if isinstance(value, Mapping):
            domain, joint = _domain_block(value, where)
            joint = tuple(self.schema.canonical(container, p, backends, where) for p in joint)
        elif isinstance(value, list):
            if not value:
                raise ConfigError(where, "the list of choices is empty")
            domain = Categorical(tuple(value))
        else:
            domain = Categorical((value,))
        if joint:
            domain = self.schema.check_joint(domain, joint, container, backends, where)
            parts = joint
        else:
            domain = self.schema.check_param(name, key, domain, container, backends, where)
            parts = (name,)
        param = Param(keys + (name,), domain, joint)
        for part in parts:
            switch = self.schema.switch_of(part, container, backends)
            if switch:
                self.switches[param.name] = switch
        return param


def _literal_choices(value: Any, where: str) -> list[Any]:
    """The values a key may take, read without a catalogue (for ``quantizer``)."""
    if isinstance(value, list):
        return value
    if isinstance(value, Mapping):
        if value.get("type", "categorical") == "categorical" and isinstance(
            value.get("choices"), list
        ):
            return value["choices"]
        raise ConfigError(where, "expected a list of backend names")
    return [value]


def _domain_block(value: Mapping, where: str) -> tuple[Domain, tuple[str, ...]]:
    """A mapping that defines a domain: a choices block (maybe joint) or a range."""
    kind = value.get("type", "categorical" if "choices" in value else None)
    joint: tuple[str, ...] = ()
    if "joint" in value:
        names = value["joint"]
        if not (
            isinstance(names, list) and len(names) >= 2 and all(isinstance(j, str) for j in names)
        ):
            raise ConfigError(f"{where}.joint", "expected a list of two or more key names")
        joint, kind = tuple(names), "categorical"
    if kind == "categorical":
        return _choices_block(value, where), joint
    if kind not in ("int", "float"):
        raise ConfigError(
            f"{where}.type",
            f"expected int, float or categorical, got {kind!r}"
            if kind is not None
            else "a mapping here needs type: int|float|categorical (or is a group of keys)",
        )
    return _range(value, kind, where), ()


def _choices_block(value: Mapping, where: str) -> Categorical:
    unknown = set(value) - {"type", "choices", "joint"}
    if unknown:
        raise ConfigError(where, f"unknown key '{sorted(unknown)[0]}' in a choices block")
    choices = value.get("choices")
    if not isinstance(choices, list):
        raise ConfigError(f"{where}.choices", "expected a list of choices")
    if not choices:
        raise ConfigError(f"{where}.choices", "the list of choices is empty")
    return Categorical(tuple(choices))


def _check_bounds(value: Mapping, kind: str, where: str) -> None:
    for bound in ("low", "high"):
        if bound not in value:
            raise ConfigError(where, f"a {kind} range needs '{bound}'")
        v = value[bound]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{bound}", f"expected a number, got {v!r}")


def _range(value: Mapping, kind: str, where: str) -> IntRange | FloatRange:
    unknown = set(value) - _RANGE_KEYS
    if unknown:
        bad = sorted(unknown)[0]
        raise ConfigError(f"{where}.{bad}", "unknown key in a range" + suggest(bad, _RANGE_KEYS))
    _check_bounds(value, kind, where)
    low, high, step, log = value["low"], value["high"], value.get("step"), value.get("log", False)
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
        return IntRange(int(low), int(high), int(step or 1), log)
    return FloatRange(float(low), float(high), None if step is None else float(step), log)


def _condition_values(
    values: tuple[Any, ...] | None, domain: Domain, ref: str, where: str
) -> tuple[Any, ...] | None:
    """The values an ``only_if`` asks of ``ref``, each as one of its choices."""
    if values is None or not isinstance(domain, Categorical):
        return values
    names = [c for c in domain.choices if isinstance(c, str)]
    out = []
    for value in values:
        if value not in domain.choices:
            value = canonical_name(value, names) or value
        if value not in domain.choices:
            raise ConfigError(
                where,
                f"'{ref}' never takes the value {value!r} "
                f"(its choices: {', '.join(map(str, domain.choices))})",
            )
        out.append(value)
    return tuple(out)


def _resolve_conditions(root: Group, base: str) -> Group:
    """Point each ``only_if`` at its parameter's full path, checked, and refuse cycles."""
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
            cond = Condition(ref, _condition_values(cond.values, params[ref].domain, ref, where))
        return Group(group.path, group.params, tuple(resolve(g) for g in group.groups), cond)

    return resolve(root)
