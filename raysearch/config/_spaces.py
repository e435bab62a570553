"""Search spaces in a config: written out, or named (the predefined spaces under
``raysearch/configs/``).

Example:
    >>> "A8W8_SEARCH" in predefined_spaces()
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from raysearch.errors import ConfigError, ErrorCollector, canonical_name, suggest
from raysearch.space import SearchSpace
from raysearch.space.points import resolve_point, resolve_points

__all__ = [
    "predefined_spaces",
    "runnable_predefined_space",
    "parse_spaces",
    "preset_search_algo",
    "NARROWED_LOGGER",
]

#: The logger of a predefined space narrowed to what this install can run.
NARROWED_LOGGER = "raysearch.config.narrowed"
_narrowed = logging.getLogger(NARROWED_LOGGER)


def predefined_spaces() -> dict[str, Path]:
    """Names of the predefined spaces shipped under ``configs/`` and their files."""
    folder = resources.files("raysearch.configs")
    out: dict[str, Path] = {}
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".yaml") and name[:-5].isupper():
            out[name[:-5]] = Path(str(entry))
    return dict(sorted(out.items()))


def preset_search_algo(name: str) -> str | None:
    """The ``search_algo`` a predefined space's file names as its default (None: none).

    Example:
        >>> preset_search_algo("WEIGHT_ONLY_INT4_SEARCH"), preset_search_algo("A8W8_SEARCH")
        ('WeightOnly', None)
    """
    return _load_predefined(name, "search_space").get("search_algo")


def _load_predefined(name: str, path: str) -> dict[str, Any]:
    """A predefined space's file by its name in any case."""
    spaces = predefined_spaces()
    name = canonical_name(name, spaces) or name
    if name not in spaces:
        raise ConfigError(
            path,
            f"unknown predefined space '{name}'"
            + suggest(name, spaces)
            + f"; known: {', '.join(spaces)}",
        )
    with spaces[name].open() as fh:
        return yaml.safe_load(fh)


def parse_spaces(data: Mapping[str, Any]) -> list[SearchSpace]:
    """The config's ``search_space`` or ``search_spaces``, parsed (a string: a predefined space)."""
    if "search_space" in data and "search_spaces" in data:
        raise ConfigError("search_spaces", "give either search_space or search_spaces, not both")
    if "search_spaces" in data:
        items = data["search_spaces"]
        if not isinstance(items, list) or not items:
            raise ConfigError("search_spaces", "expected a non-empty list of spaces")
        where = [f"search_spaces[{i}]" for i in range(len(items))]
    elif "search_space" in data:
        items, where = [data["search_space"]], ["search_space"]
    else:
        raise ConfigError("search_space", "is required (a mapping, or a predefined space name)")
    spaces = []
    errors = ErrorCollector()  # every space's mistakes, one line each
    for raw, path in zip(items, where, strict=True):
        with errors.check():
            spaces.append(_parse_one(raw, path))
    errors.raise_any()
    _add_config_starts(spaces, data.get("points_to_evaluate"))
    return spaces


def _parse_one(raw: Any, path: str) -> SearchSpace:
    """One space (a predefined one by name), with its start points, checked."""
    starts: Any = []
    if isinstance(raw, str):
        preset = _load_predefined(raw, path)
        raw, notes = _runnable(raw, preset["search_space"])
        for note in notes:
            _narrowed.warning("%s", note)
        starts = _runnable_starts(preset.get("points_to_evaluate") or [], raw)
    space = SearchSpace.parse(raw, path=path)
    space.points_to_evaluate = resolve_points(space, starts, f"{path}.points_to_evaluate")
    _check_technique_requirements(space, path)
    _check_backend_requirements(space, path)
    return space


def runnable_predefined_space(name: str) -> tuple[Any, list[str]]:
    """The predefined space ``name`` narrowed to what is installed, and notes on what was."""
    return _runnable(name, _load_predefined(name, "search_space")["search_space"])


def _runnable(name: str, raw: Any) -> tuple[Any, list[str]]:
    notes: list[str] = []
    raw = _without_missing_backends(name, raw, notes)
    return _without_missing_techniques(name, raw, notes), notes


def _runnable_starts(starts: list[Any], raw: Any) -> list[Any]:
    """A predefined space's start points without those of a backend narrowed away."""
    backends = raw.get("quantizer") if isinstance(raw, dict) else None
    if not isinstance(backends, list):
        return starts
    return [
        p for p in starts if not isinstance(p, dict) or p.get("quantizer", backends[0]) in backends
    ]


def _add_config_starts(spaces: list[SearchSpace], raws: Any) -> None:
    """The config's ``points_to_evaluate``, each run first in the first space it fits."""
    if raws is None:
        return
    if not isinstance(raws, list) or not raws:
        raise ConfigError("points_to_evaluate", "expected a non-empty list of settings")
    added: list[list[Any]] = [[] for _ in spaces]
    for i, raw in enumerate(raws):
        where = f"points_to_evaluate[{i}]"
        first_error: ConfigError | None = None
        for j, space in enumerate(spaces):
            try:
                added[j].append(resolve_point(space, raw, where))
                break
            except ConfigError as exc:
                first_error = first_error or exc
        else:
            assert first_error is not None
            raise first_error
    for space, points in zip(spaces, added, strict=True):
        space.points_to_evaluate = points + space.points_to_evaluate


def _missing_backends(values: Any) -> dict[str, str]:
    """The backends among ``values`` that cannot run here, with why."""
    from raysearch.quantize.registry import backend_missing_requirement

    names = values if isinstance(values, list) else [values]
    reasons = {n: backend_missing_requirement(n) for n in names if isinstance(n, str)}
    return {n: r for n, r in reasons.items() if r}


def _without_missing_backends(name: str, raw: Any, notes: list[str]) -> Any:
    """A preset searching several backends narrowed to those that can run here, with a note."""
    if not isinstance(raw, dict) or not isinstance(raw.get("quantizer"), list):
        return raw
    missing = _missing_backends(raw["quantizer"])
    kept = [b for b in raw["quantizer"] if b not in missing]
    if not missing or not kept:
        return raw
    for reason in missing.values():
        notes.append(f"{name}: quantizer searched as {', '.join(kept)} only: {reason}")

    def only_missing(group: Any) -> bool:
        condition = group.get("only_if") if isinstance(group, dict) else None
        if not isinstance(condition, dict) or set(condition) != {"quantizer"}:
            return False
        wanted = condition["quantizer"]
        return all(b in missing for b in (wanted if isinstance(wanted, list) else [wanted]))

    return {**_drop_groups(raw, only_missing), "quantizer": kept}


def _drop_groups(node: Any, drop: Callable[[Any], bool]) -> Any:
    """``node`` without the groups, at any depth, that ``drop`` says could never be active."""
    if not isinstance(node, dict):
        return node
    return {k: _drop_groups(v, drop) for k, v in node.items() if not drop(v)}


def _check_backend_requirements(space: SearchSpace, path: str) -> None:
    """ConfigError, naming the extra, when the space can select a backend not installed."""
    for param in space.params:
        if param.leaf == "quantizer":
            missing = _missing_backends(list(getattr(param.domain, "choices", ())))
            if missing:
                raise ConfigError(f"{path}.{param.name}", next(iter(missing.values())))


def _technique_switches() -> dict[str, type]:
    """``include_*`` key -> the technique class it switches on."""
    from raysearch.quantize.technique import registered_techniques

    return {
        key: cls
        for cls in registered_techniques()
        for key in cls.settings
        if key.startswith("include_")
    }


def _without_missing_techniques(name: str, raw: Any, notes: list[str]) -> Any:
    """A preset searching a technique on and off searches it off when its package is missing."""
    switches = _technique_switches()
    off: set[str] = set()

    def narrow(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            cls = switches.get(key)
            reason = cls.missing_requirement() if cls is not None else None
            if reason and isinstance(value, list) and any(value) and not all(value):
                notes.append(f"{name}: {key} searched as false only: {reason}")
                value = [False]
                off.add(key)
            out[key] = narrow(value)
        return out

    def needs_off_switch(group: Any) -> bool:
        condition = group.get("only_if") if isinstance(group, dict) else None
        names = [condition] if isinstance(condition, str) else list(condition or ())
        return any(n in off for n in names)

    narrowed = narrow(raw)
    return _drop_groups(narrowed, needs_off_switch) if off else narrowed


def _check_technique_requirements(space: SearchSpace, path: str) -> None:
    """ConfigError, naming the extra, when the space can switch on a technique not installed."""
    switches = _technique_switches()
    for param in space.params:
        cls = switches.get(param.leaf)
        choices = getattr(param.domain, "choices", ())
        if cls is not None and any(choices):
            reason = cls.missing_requirement()
            if reason:
                raise ConfigError(f"{path}.{param.name}", reason)
