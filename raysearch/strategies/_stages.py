"""The phases the staged strategies share: a stage made from the records before it
(:class:`DeferredPhase`, :class:`BuiltPhase`) and the calibration stage."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from raysearch.errors import InputError
from raysearch.space import SearchSpace
from raysearch.strategies._registry import EXHAUSTED, Phase, Proposal, SearchView, StrategyContext
from raysearch.strategies._roles import FINETUNE, TECHNIQUE, narrow, off_values
from raysearch.strategies._setting_phase import setting_proposal
from raysearch.strategies.grid import GridPhase
from raysearch.strategies.samplers import OptunaPhase

__all__ = [
    "DeferredPhase",
    "ListPhase",
    "BuiltPhase",
    "distinct_accepted",
    "calibration_phases",
    "sub_phase",
]

_logger = logging.getLogger(__name__)


class DeferredPhase(Phase):
    """A stage whose phase is made from the results before it (:meth:`make`) once no earlier
    trial runs; None skips it. ``index``: the phase's position in the strategy."""

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
        values: tuple[float, ...] | None = None,
    ) -> None:
        if self.inner is not None:
            self.inner.completed(proposal, metric, error, objective=objective, values=values)


class ListPhase(Phase):
    """Each of ``proposals`` that did not run yet, all at once; then exhausted."""

    def __init__(self, proposals: Sequence[Proposal], stage: str) -> None:
        self.proposals = list(proposals)
        self.stage = stage
        self.finished = False

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        for proposal in self.proposals:
            if not search.knows(proposal.key):
                return proposal
        if not self.finished:
            self.finished = True
            _logger.info("stage %s ends: each of its settings was started", self.stage)
        return EXHAUSTED


class BuiltPhase(DeferredPhase):
    """A stage that runs a list of settings built (:meth:`build`) from the records before it
    once no earlier trial runs, all at once; None skips it. A setting that ran or runs is never
    proposed again, so a resumed search goes on where it stopped."""

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        """The settings this stage runs (None: the stage is skipped)."""
        raise NotImplementedError

    def make(self, context: StrategyContext) -> Phase | None:
        settings = self.build(context)
        if settings is None:
            return None
        proposals = self.proposals(settings)
        if not proposals:
            _logger.info(
                "stage %s skipped: none of its %d setting(s) can run (each left out above)",
                self.stage,
                len(settings),
            )
            return None
        _logger.info("stage %s: %d setting(s) to run", self.stage, len(proposals))
        return ListPhase(proposals, self.stage)

    def proposals(self, settings: Sequence[Mapping[str, Any]]) -> list[Proposal]:
        """Each setting's proposal; one the catalogues or the backend refuse is left out."""
        out: list[Proposal] = []
        for setting in settings:
            try:
                proposal = setting_proposal(setting, self.index)
            except InputError as exc:  # a combination the catalogues refuse: not run
                _logger.info("%s: %s left out (%s)", self.stage, dict(setting), exc)
                continue
            out.append(proposal)
        return distinct_accepted(out, self.context.reject if self.context else None, self.stage)


def distinct_accepted(
    proposals: Iterable[Proposal], reject: Callable[[dict[str, Any]], str | None] | None, stage: str
) -> list[Proposal]:
    """``proposals`` without the ones the backend refuses (``reject``) and without repeats."""
    out: list[Proposal] = []
    for proposal in proposals:
        reason = reject(proposal.settings) if reject else None
        if reason:
            _logger.info("%s: a setting left out: %s", stage, reason)
        elif all(p.key != proposal.key for p in out):
            out.append(proposal)
    return out


def calibration_phases(
    context: StrategyContext,
    budget: int,
    stage: str = "calibration",
    roles_off: Sequence[str] = (TECHNIQUE, FINETUNE),
) -> list[Phase]:
    """The calibration stage: each space with the switches of ``roles_off`` off (where the
    space offers them off), ``budget`` split between the spaces (:func:`sub_phase`)."""
    share = max(1, budget // max(1, len(context.spaces)))
    return [
        sub_phase(context, narrow(space, off_values(space, roles_off)), i, share, stage)
        for i, space in enumerate(context.spaces)
    ]


def sub_phase(
    context: StrategyContext, space: SearchSpace, index: int, budget: int | None, stage: str
) -> Phase:
    """One space (recorded as space ``index``) as a grid when it has no ranges and fits
    ``budget`` (None: any size), else TPE with ``budget`` trials."""
    phase: Phase
    if not space.has_ranges and (budget is None or len(space.expand(context.reject)) <= budget):
        phase = _IndexedGrid(space, index, context)
    else:
        seed = None if context.seed is None else context.seed + index
        phase = OptunaPhase(
            space,
            index,
            "TPE",
            seed,
            context.mode,
            context.reject,
            budget,
            concurrent=context.concurrent,
        )
    phase.stage = stage  # type: ignore[attr-defined]
    return phase


class _IndexedGrid(GridPhase):
    """A grid over one space recorded as space ``index`` (its place among the config's)."""

    def __init__(self, space: SearchSpace, index: int, context: StrategyContext) -> None:
        super().__init__([space], context.reject)
        self.items = [(index, point) for _, point in self.items]
        self.spaces = [space] * (index + 1)
