"""Checks of a search space against the settings catalogues of its backends.

A key is checked against the catalogue of every backend it can be active with: the space's
``quantizer`` choices, narrowed by the ``only_if: {quantizer: ...}`` conditions around it; a
key of one backend where another can be active is refused with both named. A value from a
fixed vocabulary is read in any case and kept as the catalogue spells it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.space.catalogue import (
    DEFAULT_BACKEND,
    Catalogue,
    OptionSpec,
    check_value,
    unavailable_reason,
)
from raysearch.space.tree import Categorical, Domain, FloatRange, IntRange

__all__ = ["Schema", "QUANTIZER_KEY"]

#: The setting whose value selects the backend of a point.
QUANTIZER_KEY = "quantizer"


class Schema:
    """The catalogues a space is checked against (by backend name) and the checks."""

    def __init__(self, catalogues: Mapping[str, Catalogue]) -> None:
        self.catalogues = dict(catalogues)

    def backend_choices(self, values: Sequence[Any], where: str) -> tuple[str, ...]:
        """The backends ``quantizer`` may take, each checked to have a catalogue."""
        known = sorted(self.catalogues)
        names = []
        for value in values:
            name = canonical_name(value, known)
            if name is None:
                raise ConfigError(
                    where,
                    f"unknown quantizer backend {value!r}"
                    + (suggest(value, known) if isinstance(value, str) else "")
                    + "; known: "
                    + ", ".join(known),
                )
            names.append(name)
        return tuple(dict.fromkeys(names))

    def backend_name(self, value: Any) -> Any:
        """The backend ``value`` names, as registered (``ORT`` is ``ort``); else ``value``."""
        return canonical_name(value, self.catalogues) or value

    def containers(self, backends: Sequence[str]) -> set[str]:
        """Keys whose mapping holds further settings (``extra_options``) for ``backends``."""
        return {c for b in backends for c in self.catalogues[b].containers}

    def default_backends(self) -> tuple[str, ...]:
        """The backend of a space that sets no ``quantizer``."""
        if DEFAULT_BACKEND in self.catalogues:
            return (DEFAULT_BACKEND,)
        if len(self.catalogues) == 1:
            return tuple(self.catalogues)
        raise ConfigError(
            QUANTIZER_KEY,
            f"is required: the default backend '{DEFAULT_BACKEND}' has no catalogue here "
            f"(known: {', '.join(sorted(self.catalogues))})",
        )

    def canonical(self, container: str, key: str, backends: Sequence[str], where: str) -> str:
        """The canonical name of ``key``; an alias backends resolve differently is an error."""
        names = {self.catalogues[b].canonical(container, key) for b in backends}
        if len(names) > 1:
            raise ConfigError(
                where, f"'{key}' means {', '.join(sorted(names))} to different backends"
            )
        return names.pop() if names else key

    def check_available(self, key: str, backends: Sequence[str], where: str) -> None:
        reason = unavailable_reason(key, (self.catalogues[b] for b in backends))
        if reason:
            raise ConfigError(where, reason)

    def check_group_name(
        self, key: str, container: str, backends: Sequence[str], where: str
    ) -> None:
        for backend in backends:
            spec = self.catalogues[backend].spec(container, key)
            if spec is not None and spec.kind != "dict":
                raise ConfigError(
                    where, f"expected a list of choices or a range for '{key}', got a mapping"
                )

    def check_param(
        self,
        name: str,
        key: str,
        domain: Domain,
        container: str,
        backends: Sequence[str],
        where: str,
    ) -> Domain:
        """Check ``name`` against every backend of ``backends``; ``domain`` canonically spelled."""
        specs = self.specs(name, key, container, backends, where)
        if isinstance(domain, Categorical):
            domain = Categorical(
                tuple(self.canonical_value(name, specs, v) for v in domain.choices)
            )
        for spec in specs:
            self.check_choices(spec, name, domain, where)
        return domain

    def canonical_value(self, name: str, specs: Sequence[OptionSpec], value: Any) -> Any:
        """``value`` of setting ``name`` as the catalogue spells it, else as it is."""
        if name == QUANTIZER_KEY:
            return self.backend_name(value)
        for spec in specs:
            if spec.kind == "enum":
                named = canonical_name(value, [c for c in spec.choices if isinstance(c, str)])
                value = value if named is None else named
        return value

    def specs(
        self, name: str, key: str, container: str, backends: Sequence[str], where: str
    ) -> list[OptionSpec]:
        """The spec of ``name`` in each backend's catalogue; ConfigError when one lacks it."""
        known = [b for b in backends if self.catalogues[b].spec(container, name) is not None]
        if len(known) < len(backends):
            missing = next(b for b in backends if b not in known)
            if known:
                raise ConfigError(
                    where,
                    f"'{name}' is a setting of backend {self._names(known)}, not of '{missing}': "
                    f"put it in a group with only_if: {{quantizer: {known[0]}}}",
                )
            raise ConfigError(where, self._unknown(name, key, container, backends))
        specs = [self.catalogues[b].table(container)[name] for b in backends]
        for spec in specs:
            if spec.kind == "dict":  # a container given as a list or a value
                raise ConfigError(where, f"expected a mapping of {name} keys, got a list or value")
        return specs

    def check_joint(
        self,
        domain: Domain,
        joint: tuple[str, ...],
        container: str,
        backends: Sequence[str],
        where: str,
    ) -> Categorical:
        """Check each part of a joint parameter; ``domain`` canonically spelled."""
        if not isinstance(domain, Categorical):
            raise ConfigError(where, "a joint parameter needs a list of choices")
        if len(set(joint)) != len(joint):
            raise ConfigError(f"{where}.joint", f"names a setting twice: {', '.join(joint)}")
        specs = {}
        for part in joint:
            self.check_available(part, backends, f"{where}.joint.{part}")
            specs[part] = self.specs(part, part, container, backends, f"{where}.joint.{part}")
        choices = []
        for i, choice in enumerate(domain.choices):
            if not isinstance(choice, list) or len(choice) != len(joint):
                raise ConfigError(
                    where,
                    f"each choice of a joint parameter sets {', '.join(joint)}: expected a list "
                    f"of {len(joint)} values, got {choice!r}",
                )
            choice = [self.canonical_value(p, specs[p], v) for p, v in zip(joint, choice)]
            for part, value in zip(joint, choice):
                for spec in specs[part]:
                    problem = check_value(spec, value)
                    if problem:
                        raise ConfigError(f"{where}.choices[{i}]", f"{part}: {problem}")
            choices.append(choice)
        return Categorical(tuple(choices))

    @staticmethod
    def check_choices(spec: OptionSpec, name: str, domain: Domain, where: str) -> None:
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

    def switch_of(self, name: str, container: str, backends: Sequence[str]) -> str | None:
        """The switch key (``OptionSpec.requires``) a setting only acts with, if any."""
        for backend in backends:
            spec = self.catalogues[backend].spec(container, name)
            if spec is not None and spec.requires:
                return spec.requires
        return None

    @staticmethod
    def _names(backends: Sequence[str]) -> str:
        return ", ".join(f"'{b}'" for b in backends)

    def _unknown(self, name: str, key: str, container: str, backends: Sequence[str]) -> str:
        """ "unknown key" with the closest known key, or the container it belongs in."""
        here: set[str] = set()
        for backend in backends:
            here |= set(self.catalogues[backend].table(container))
        hint = suggest(key, sorted(here))
        if not hint:
            hint = self._elsewhere(key, container, backends)
        others = [b for b in self.catalogues if b not in backends]
        owners = [b for b in others if self.catalogues[b].spec(container, name) is not None]
        if not hint and owners:
            hint = (
                f" ('{name}' is a setting of backend {self._names(owners)}: set quantizer to it, "
                f"or put it in a group with only_if: {{quantizer: {owners[0]}}})"
            )
        return "unknown key" + hint

    def _elsewhere(self, key: str, container: str, backends: Sequence[str]) -> str:
        for backend in backends:
            catalogue = self.catalogues[backend]
            for other in ("", *catalogue.containers):
                if other != container and catalogue.canonical(other, key) in catalogue.table(other):
                    if other:
                        return f" ('{key}' is an {other} key: put it under {other})"
                    return f" ('{key}' is a top-level setting, not an {container} key)"
        return ""
