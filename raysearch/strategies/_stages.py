"""What the staged strategies (``Auto``, ``TwoStage``, ``FinetuneSearch``) share: which
parameters of a space are calibration settings, cheap techniques or fine-tuning, spaces
narrowed to some of their values, settings deltas, and a phase that runs a list of settings
built from the records before it.

A parameter's *role* comes from its name (the last parts of its dotted path, so a
backend-group's ``ort.include_cle`` is a technique as ``include_cle`` is): the switches of the
cheap techniques (``include_cle``, ``include_sq``, ``include_bias_correction``,
``mixed_precision.top_k``) and of fine-tuning (``include_fast_ft``), and every parameter that
only acts with one of those switches on (``space.switches`` and ``only_if`` conditions). The
rest are calibration settings.

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
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from raysearch.space import Categorical, Group, Param, SearchSpace, expand_spaces
from raysearch.space.tree import FloatRange, IntRange
from raysearch.strategies._registry import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
)
from raysearch.strategies._setting_phase import RecordReader, setting_proposal

__all__ = [
    "TECHNIQUE",
    "FINETUNE",
    "CALIBRATION",
    "SWITCHES",
    "roles",
    "off_values",
    "narrow",
    "redomain",
    "role_deltas",
    "DeferredPhase",
    "complete_point",
    "settings_delta",
    "merge_settings",
    "BuiltPhase",
]

_logger = logging.getLogger(__name__)

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


def _redomain_group(group: Group, domains: Mapping[str, Any]) -> Group:
    params = tuple(
        dataclasses.replace(p, domain=domains[p.name]) if p.name in domains else p
        for p in group.params
    )
    groups = tuple(_redomain_group(g, domains) for g in group.groups)
    return dataclasses.replace(group, params=params, groups=groups)


def redomain(space: SearchSpace, domains: Mapping[str, Any]) -> SearchSpace:
    """``space`` with the parameters named in ``domains`` given those domains (a
    ``Categorical``, ``IntRange`` or ``FloatRange``); the same parameter names, so its points
    are points of ``space``."""
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
    """``point`` (maybe partial: a ``points_to_evaluate`` entry) with every active parameter it
    lacks at its first choice (a range at its low end, the geometric middle of a log range)."""
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
    fine-tuning off, one delta per distinct way the space offers (``include_sq`` with each
    ``SmoothAlpha``, fine-tuning with each algorithm and its parameters), each switching on
    exactly one switch of the role. Calibration parameters are held at their first value (a
    technique's settings do not depend on them); a range is read at its first value
    (:func:`complete_point`)."""
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


class BuiltPhase(RecordReader, Phase):
    """A stage that runs a list of settings built from the records before it, all at once.

    The list is built (:meth:`build`) once no earlier trial runs any more, so that it sees
    every result before it; None skips the stage (the reason logged by :meth:`build`). A
    setting that already ran or runs is never proposed again, so a resumed search (records
    replayed into fresh phases, which build the same lists) goes on where it stopped.
    ``index`` is the phase's position in the strategy (``phase`` of its records)."""

    stage = "stage"

    def __init__(self, index: int) -> None:
        self.index = index
        self.items: list[Proposal] | None = None
        self.finished = False

    def start(self, context: StrategyContext) -> None:
        self.context = context

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        """The settings this stage runs (None: the stage is skipped)."""
        raise NotImplementedError

    def proposals(self, settings: Sequence[Mapping[str, Any]]) -> list[Proposal]:
        """Each setting's proposal; one the catalogues or the backend refuse is left out."""
        out: list[Proposal] = []
        reject: Callable[[dict[str, Any]], str | None] | None = None
        if self.context is not None:
            reject = self.context.reject
        for setting in settings:
            try:
                proposal = setting_proposal(setting, self.index)
            except Exception as exc:  # a combination the catalogues refuse: not run
                _logger.info("%s: %s left out (%s)", self.stage, dict(setting), exc)
                continue
            reason = reject(proposal.settings) if reject else None
            if reason:
                _logger.info("%s: a setting left out: %s", self.stage, reason)
                continue
            if all(p.key != proposal.key for p in out):
                out.append(proposal)
        return out

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        if self.finished:
            return EXHAUSTED
        if self.items is None:
            if search.live_keys:
                return None  # the stage is built from every result before it
            assert self.context is not None
            settings = self.build(self.context)
            if settings is None:
                self.finished = True
                return EXHAUSTED
            self.items = self.proposals(settings)
            _logger.info("stage %s: %d setting(s) to run", self.stage, len(self.items))
        for proposal in self.items:
            if not search.knows(proposal.key):
                return proposal
        self.finished = True
        _logger.info("stage %s ends: each of its settings was started", self.stage)
        return EXHAUSTED


class DeferredPhase(Phase):
    """A stage whose phase is made from the results before it (:meth:`make`), once no earlier
    trial runs: two-stage's fine-tuning search around stage 1's best. None skips it."""

    stage = "stage"

    def __init__(self, index: int) -> None:
        self.index = index
        self.inner: Phase | None = None
        self.skipped = False
        self.context: StrategyContext | None = None

    def start(self, context: StrategyContext) -> None:
        self.context = context

    def make(self, context: StrategyContext) -> Phase | None:
        """The phase this stage runs (None: skipped; say why in the log)."""
        raise NotImplementedError

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        if self.skipped:
            return EXHAUSTED
        if self.inner is None:
            if search.live_keys:
                return None  # made from every result before it
            assert self.context is not None
            self.inner = self.make(self.context)
            if self.inner is None:
                self.skipped = True
                return EXHAUSTED
            self.budget = self.inner.budget
            self.inner.start(self.context)
        return self.inner.propose(trial_id, search)

    def completed(
        self,
        proposal: Proposal,
        metric: float | None,
        error: bool,
        *,
        objective: float | None = None,
    ) -> None:
        if self.inner is not None:
            self.inner.completed(proposal, metric, error, objective=objective)
