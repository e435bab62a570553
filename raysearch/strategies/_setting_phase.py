"""Phases that propose settings outside the user's space (a strategy's own): one-point spaces
validated against the catalogues, and reading each finished record once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.errors import InputError
from raysearch.ranking import is_candidate
from raysearch.space import SearchSpace, fixed_space
from raysearch.strategies._registry import Proposal, StrategyContext
from raysearch.trialrecord import TrialRecord

__all__ = [
    "setting_space",
    "setting_proposal",
    "setting_refusal",
    "meets_tolerance",
    "records_before",
    "extra_count",
    "RecordReader",
]


def _flat(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Nested settings as dotted parameter names (``mixed_precision.top_k``); a setting whose
    value is a mapping (``node_settings``: no group of settings) is kept whole."""
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, Mapping) and not _mapping_valued(name):
            for sub, inner in value.items():
                flat[f"{name}.{sub}"] = inner
        else:
            flat[name] = value
    return flat


def _mapping_valued(name: str) -> bool:
    """Whether a backend has ``name`` as a top-level setting whose value is a mapping."""
    from raysearch.space.catalogue import registered_catalogues

    return any(
        (spec := catalogue.settings.get(name)) is not None and spec.kind == "mapping"
        for catalogue in registered_catalogues().values()
    )


def setting_space(settings: Mapping[str, Any]) -> SearchSpace:
    """A search space with exactly one point: ``settings`` (validated against the catalogues
    like any user space).

    Raises:
        InputError: the catalogues refuse a key, or the space would not give back ``settings``.

    Example:
        >>> space = setting_space({"per_channel": False, "mixed_precision": {"top_k": 2}})
        >>> space.to_settings(space.expand().points[0])
        {'per_channel': False, 'mixed_precision': {'top_k': 2}}
    """

    space = SearchSpace.parse(fixed_space(_flat(settings)), path="fallback")
    points = space.expand().points
    if len(points) != 1 or space.to_settings(points[0]) != dict(settings):
        why = _dropped(settings)
        raise InputError(  # a ValueError, as the ConfigError of a key the catalogues refuse
            f"settings {dict(settings)!r} are not one point of a search space"
            + (f": {why}" if why else "")
        )
    return space


def _dropped(settings: Mapping[str, Any]) -> str:
    """Which validity rules strip which keys of ``settings`` (empty: none does), in words."""
    from raysearch.space.rules import RULES

    flat = _flat(settings)
    said = [f"{rule.__name__} drops {', '.join(keys)}" for rule in RULES if (keys := rule(flat))]
    return "; ".join(said)


def setting_refusal(settings: Mapping[str, Any], context: StrategyContext | None) -> str | None:
    """Why ``settings`` cannot run as one point of a search space (the catalogues, the
    validity rules or ``context.reject`` refuse them); None when they can.

    Example:
        >>> setting_refusal({"per_channel": True, "mixed_precision": {"top_k": 2}}, None)
        >>> setting_refusal({"quant_mode": "dynamic", "mixed_precision": {"top_k": 2}}, None)
        'static_settings_in_dynamic_mode drops mixed_precision.top_k'
    """
    try:
        setting_space(settings)
    except ValueError as exc:  # ConfigError (a key the catalogues refuse) is a ValueError
        text = str(exc)
        head = "are not one point of a search space: "
        return text.split(head, 1)[1] if head in text else text
    reject = context.reject if context is not None else None
    return reject(dict(settings)) if reject is not None else None


def setting_proposal(settings: Mapping[str, Any], index: int) -> Proposal:
    """The :class:`Proposal` of ``settings``, recorded with ``phase`` = ``index``."""
    space = setting_space(settings)
    return Proposal.of(space, index, space.expand().points[0])


def records_before(records: Sequence[TrialRecord], index: int) -> list[TrialRecord]:
    """The records of the phases before the one at ``index`` (what a resumed search rebuilds
    the same settings from)."""
    return [r for r in records if int(r.phase or 0) < index]


def meets_tolerance(record: TrialRecord) -> bool:
    """Whether a finished record's metric is within the tolerance: a candidate, or a trial
    that quantizes nothing whose metric met it (``extra.within_tolerance``)."""
    if is_candidate(record):
        return True
    return record.ok and bool(record.extra.get("within_tolerance"))


def extra_count(record: TrialRecord, name: str) -> int | None:
    """The whole number ``extra[name]`` of a record (``promoted``, ``ranked``), or None."""
    value = record.extra.get(name)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class RecordReader:
    """Reads the records of ``context`` once each, in the order they arrived."""

    context: StrategyContext | None = None
    _read = 0

    def _new_records(self) -> list[dict[str, Any]]:
        if self.context is None:
            return []
        records = self.context.records[self._read :]
        self._read = len(self.context.records)
        return records
