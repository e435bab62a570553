"""The roles of a space's parameters for the staged strategies: calibration settings, cheap
techniques (``include_cle``, ``include_sq``, ``include_bias_correction``,
``mixed_precision.top_k`` and what acts only with them on) or fine-tuning (``include_fast_ft``
and its own); spaces narrowed to some values; settings deltas.

Example:
    >>> from raysearch.space import SearchSpace
    >>> space = SearchSpace.parse({"per_channel": [True, False], "include_cle": [False, True]})
    >>> roles(space)
    {'per_channel': 'calibration', 'include_cle': 'technique'}
    >>> len(narrow(space, off_values(space, ("technique",))).expand())
    2
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from raysearch.space import Categorical, Group, Param, SearchSpace, expand_spaces
from raysearch.space.tree import FloatRange, IntRange

__all__ = [
    "TECHNIQUE",
    "FINETUNE",
    "roles",
    "off_values",
    "finetuning_on",
    "narrow",
    "redomain",
    "complete_point",
    "merge_settings",
    "role_deltas",
]


TECHNIQUE = "technique"
FINETUNE = "finetune"
CALIBRATION = "calibration"

#: Switch parameter (its last dotted parts) -> (role, the value that switches it off).
SWITCHES: dict[str, tuple[str, Any]] = {
    "include_cle": (TECHNIQUE, False),
    "include_sq": (TECHNIQUE, False),
    "include_bias_correction": (TECHNIQUE, False),
    "mixed_precision.top_k": (TECHNIQUE, 0),
    "include_fast_ft": (FINETUNE, False),
}
#: Parameters that are fine-tuning's own wherever they are declared (Quark spells them in
#: ``extra_options``, not under a group that names the switch).
_FINETUNE_OPTIONS = frozenset(
    {"OptimAlgorithm", "NumIterations", "LearningRate", "NumIterLR", "BatchSize", "DataSize"}
)


def _switch_of(name: str) -> str | None:
    for switch in SWITCHES:
        if name == switch or name.endswith("." + switch):
            return switch
    return None


def roles(space: SearchSpace) -> dict[str, str]:
    """Each parameter's role (:data:`CALIBRATION`, :data:`TECHNIQUE`, :data:`FINETUNE`)."""
    out: dict[str, str] = {}
    for param in space.params:
        switch = _switch_of(param.name)
        if switch is not None:
            out[param.name] = SWITCHES[switch][0]
            continue
        refs = [c.ref for c in space._conditions[param.name]]
        if param.name in space.switches:
            refs.append(space.switches[param.name])
        if param.name.startswith("mixed_precision.") or ".mixed_precision." in param.name:
            refs.append("mixed_precision.top_k")
        role = CALIBRATION
        for ref in refs:
            ref_switch = _switch_of(ref)
            ref_role = SWITCHES[ref_switch][0] if ref_switch else out.get(ref, CALIBRATION)
            if ref_role == FINETUNE or (ref_role == TECHNIQUE and role == CALIBRATION):
                role = ref_role
        if param.leaf in _FINETUNE_OPTIONS:
            role = FINETUNE
        out[param.name] = role
    return out


def off_values(space: SearchSpace, which: Iterable[str]) -> dict[str, Any]:
    """The switches of the roles ``which`` set to their off value, where the space offers it
    (a space that only has ``include_fast_ft: [true]`` keeps it on)."""
    wanted = set(which)
    out: dict[str, Any] = {}
    for param in space.params:
        switch = _switch_of(param.name)
        if switch is None or SWITCHES[switch][0] not in wanted:
            continue
        off = SWITCHES[switch][1]
        if isinstance(param.domain, Categorical) and off in param.domain.choices:
            out[param.name] = off
    return out


def finetuning_on(space: SearchSpace) -> dict[str, bool]:
    """The space's fine-tuning switches (``include_fast_ft``) that it offers on, each as
    ``True`` (empty: the space cannot fine-tune).

    Example:
        >>> finetuning_on(SearchSpace.parse({"include_fast_ft": [False, True]}))
        {'include_fast_ft': True}
    """
    return {
        p.name: True
        for p in space.params
        if _switch_of(p.name) == "include_fast_ft"
        and isinstance(p.domain, Categorical)
        and True in p.domain.choices
    }


def _redomain_group(group: Group, domains: Mapping[str, Any]) -> Group:
    params = tuple(
        dataclasses.replace(p, domain=domains[p.name]) if p.name in domains else p
        for p in group.params
    )
    groups = tuple(_redomain_group(g, domains) for g in group.groups)
    return dataclasses.replace(group, params=params, groups=groups)


def redomain(space: SearchSpace, domains: Mapping[str, Any]) -> SearchSpace:
    """``space`` with the parameters named in ``domains`` given those domains."""
    known = {p.name for p in space.params}
    return SearchSpace(
        _redomain_group(space.root, {n: d for n, d in domains.items() if n in known}),
        name=space.name,
        containers=space.containers,
        switches=space.switches,
    )


def narrow(space: SearchSpace, fixed: Mapping[str, Any]) -> SearchSpace:
    """``space`` with the parameters named in ``fixed`` held at those values (the others as
    they are): :func:`redomain` with one-value choices."""
    return redomain(space, {name: Categorical((value,)) for name, value in fixed.items()})


def complete_point(space: SearchSpace, point: Mapping[str, Any]) -> dict[str, Any]:
    """``point`` (maybe partial) with every active parameter it lacks at its first choice."""
    out = dict(point)
    for param in space.params:
        if param.name in out or not space.is_active(param, out):
            continue
        out[param.name] = _first(param)
    # Values of parameters that are not active (a partial point's) are left to the rules.
    return out


def _first(param: Param) -> Any:
    domain = param.domain
    if isinstance(domain, Categorical):
        return domain.choices[0]
    if isinstance(domain, IntRange):
        if domain.log:
            return int(round((domain.low * domain.high) ** 0.5))
        return domain.low
    assert isinstance(domain, FloatRange)
    return (domain.low * domain.high) ** 0.5 if domain.log else domain.low


def settings_delta(on: Mapping[str, Any], off: Mapping[str, Any]) -> dict[str, Any]:
    """What ``on`` sets that ``off`` does not (nested mappings compared key by key).

    Example:
        >>> settings_delta({"a": 1, "extra_options": {"X": 1, "Y": 2}},
        ...                {"a": 1, "extra_options": {"X": 1}})
        {'extra_options': {'Y': 2}}
    """
    delta: dict[str, Any] = {}
    for key, value in on.items():
        other = off.get(key)
        if isinstance(value, Mapping) and isinstance(other, Mapping):
            inner = settings_delta(value, other)
            if inner:
                delta[key] = inner
        elif key not in off or other != value:
            delta[key] = copy.deepcopy(value)
    return delta


def merge_settings(base: Mapping[str, Any], *deltas: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with each delta laid over it (nested mappings merged key by key).

    Example:
        >>> merge_settings({"extra_options": {"X": 1}}, {"extra_options": {"Y": 2}})
        {'extra_options': {'X': 1, 'Y': 2}}
    """
    out = copy.deepcopy(dict(base))
    for delta in deltas:
        for key, value in delta.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merge_settings(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def role_deltas(space: SearchSpace, role: str, reject: Any = None) -> list[dict[str, Any]]:
    """The settings one setting of ``role`` adds to a setting with every technique and
    fine-tuning off, one delta per distinct way the space offers, each switching on exactly
    one switch of the role (calibration parameters at their first value)."""
    names = roles(space)
    first = complete_point(space, {})
    fixed = {n: first[n] for n, r in names.items() if r == CALIBRATION and n in first}
    fixed.update(off_values(space, {TECHNIQUE, FINETUNE} - {role}))
    fixed.update({p.name: _first(p) for p in space.params if not isinstance(p.domain, Categorical)})
    sub = narrow(space, fixed)
    off = off_values(space, (role,))
    switches = [n for n in off if names.get(n) == role]
    base_point = complete_point(sub, off)
    base = space.to_settings(space.canonical(base_point)[0])
    out: list[dict[str, Any]] = []
    for point in expand_spaces([sub], reject).points:
        on = [n for n in switches if point.get(n, off[n]) != off[n]]
        if len(on) != 1:
            continue
        delta = settings_delta(space.to_settings(point), base)
        if delta and delta not in out:
            out.append(delta)
    return out
