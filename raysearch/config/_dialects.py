"""Configs of Quark (``_quark``) and Neural Compressor (``_inc``) read as raysearch's: each of
their names mapped (one INFO line) or refused with why.

Example:
    >>> t = Translation({"n_trials": 5}, ErrorCollector())
    >>> t.move("n_trials", "stop.iteration_limit")
    >>> t.data, t.notes
    ({'stop': {'iteration_limit': 5}}, ['n_trials -> stop.iteration_limit'])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from raysearch.errors import ConfigError, ErrorCollector

__all__ = ["Translation", "LOGGER"]

#: The logger of the mappings: the command line shows its INFO records.
LOGGER = "raysearch.config.dialects"
_logger = logging.getLogger(LOGGER)
_UNSET: Any = object()


@dataclass
class Translation:
    """A config being read as raysearch's: its data, the ``notes`` (logged once) and ``errors``."""

    data: dict[str, Any]
    errors: ErrorCollector
    notes: list[str] = field(default_factory=list)

    def move(
        self, key: str, target: str, *, value: Any = _UNSET, source: str | None = None
    ) -> None:
        """Set dotted ``target`` to ``data[key]`` (removed) or ``value``; refused if also given."""
        given = value is not _UNSET
        if not given:
            value = self.data.pop(key)
        name = source or key
        head, _, tail = target.partition(".")
        holder = self.data if not tail else self.data.setdefault(head, {})
        leaf = tail or head
        if not isinstance(holder, dict):
            self.errors.add(ConfigError(head, f"expected a mapping, got {holder!r}"))
            return
        if leaf in holder:
            self.errors.add(ConfigError(name, f"given together with '{target}': keep one of them"))
            return
        holder[leaf] = value
        self.notes.append(f"{name} -> {target}")

    def drop(self, key: str, why: str, *, source: str | None = None) -> None:
        """Remove ``key``, which asks for what raysearch does anyway (``why`` says what)."""
        self.data.pop(key, None)
        self.notes.append(f"{source or key}: {why}")

    def refuse(self, key: str, why: str, *, source: str | None = None) -> None:
        """Remove ``key`` and refuse it with ``why`` (one line, naming the key)."""
        self.data.pop(key, None)
        self.errors.add(ConfigError(source or key, why))

    def log(self) -> None:
        """Log the mappings, once, in one INFO line."""
        if self.notes:
            _logger.info(
                "config: read as raysearch's names: %s", "; ".join(dict.fromkeys(self.notes))
            )
