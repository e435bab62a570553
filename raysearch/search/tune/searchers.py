"""One Ray Tune ``Searcher`` over the phases of a strategy (:mod:`raysearch.strategies`), run
in order, each phase's ``start`` seeing the records finished before it; a setting runs at most
once across them. A ``reusable`` proposal the probe cache kept
(:mod:`raysearch.search.record.probe_cache`) is journaled as a trial of its own, run by no
actor. The searcher caps the trials *started* at ``stop.iteration_limit``; the trials suggested
but unfinished are capped by Ray Tune's ``ConcurrencyLimiter`` around it (``make_tuner``).

Example:
    >>> space = SearchSpace.parse({"per_channel": [True, False]})
    >>> searcher = SettingSearcher.strategy("Grid", [space], mode="min")
    >>> [searcher.suggest(str(i))["params"] for i in range(2)]
    [{'per_channel': True}, {'per_channel': False}]
    >>> searcher.suggest("2")   # every setting was proposed: the grid is done
    'FINISHED'
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.tune.search import Searcher

from raysearch.search.record.reported import reported_record
from raysearch.search.tune._searcher_known import KnownSettings
from raysearch.search.tune._searcher_session import SessionLink
from raysearch.space import SearchSpace
from raysearch.strategies import (
    EXHAUSTED,
    Phase,
    Proposal,
    StrategyContext,
    get_strategy,
)

__all__ = ["SettingSearcher"]

_logger = logging.getLogger(__name__)

#: What :meth:`SettingSearcher._propose` returns when the phase's trial budget is used.
_BUDGET_USED = "budget_used"


@dataclass
class _State:
    started: int = 0
    phase: int = 0
    phase_started: list[int] = field(default_factory=list)
    live: dict[str, Proposal] = field(default_factory=dict)
    #: trial id -> position in ``phases`` of the phase that proposed it
    live_phase: dict[str, int] = field(default_factory=dict)
    #: trial id -> the trial's number (its place in the start order)
    live_number: dict[str, int] = field(default_factory=dict)
    finished_ids: set[str] = field(default_factory=set)
    finish_reason: str | None = None
    waiting: bool = False
    #: The last phase whose ``start`` ran (-1: none yet).
    begun: int = -1
    #: Trials this searcher started (``started`` also counts the journal's, on resume).
    started_here: int = 0
    #: The numbers of trials started before an interruption that did not finish: a resumed
    #: search gives them to its next trials first, which propose those settings again.
    holes: list[int] = field(default_factory=list)


class SettingSearcher(SessionLink, KnownSettings, Searcher):
    """Ray Tune ``Searcher`` over the phases of a search. A suggestion is a trial config:
    ``number``, ``phase``, ``stage``, ``point``, ``params`` (recorded), ``settings`` (run) and
    ``key`` (their identity)."""

    def __init__(
        self,
        phases: Sequence[Phase],
        *,
        mode: str,
        max_trials: int | None = None,
        session_key: str | None = None,
        context: StrategyContext | None = None,
    ) -> None:
        super().__init__(metric="metric", mode=mode)
        self.phases = list(phases)
        self.context = context or StrategyContext([], mode=mode, max_trials=max_trials)
        #: The search's id, to find its live session (:mod:`raysearch.search.tune.session`).
        self.session_key = session_key
        self.max_trials = max_trials if max_trials and max_trials > 0 else None
        self.state = _State(phase_started=[0] * len(phases))
        #: The import a phase failed before any trial started: refused as a bad input.
        self.missing_module: ImportError | None = None
        #: key -> metric (None when the trial failed) of every finished setting.
        self.done: dict[str, float | None] = {}
        #: key -> what the samplers optimise (the trial's ``objective``, else its metric).
        self.objectives: dict[str, float | None] = {}
        #: key -> each of several ``context.objectives``' values, for a multi-objective sampler.
        self.values: dict[str, tuple[float, ...] | None] = {}

    @classmethod
    def from_strategy(cls, name: str, context: StrategyContext) -> SettingSearcher:
        """The phases of the strategy registered as ``name``, built from ``context``."""
        phases = list(get_strategy(name)(context))
        return cls(phases, mode=context.mode, max_trials=context.max_trials, context=context)

    @classmethod
    def strategy(cls, name: str, spaces: Sequence[SearchSpace], **context: Any) -> SettingSearcher:
        """The searcher of the strategy ``name`` (``Grid``, a sampler's) over ``spaces``;
        ``context``: the other fields of :class:`StrategyContext` (``mode``, ``seed``, ...)."""
        return cls.from_strategy(name, StrategyContext(spaces, **context))

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        state = self.state
        if state.finish_reason is not None:
            return Searcher.FINISHED
        if state.waiting:
            return None
        if self.max_trials is not None and state.started >= self.max_trials:
            return self._finish("iteration_limit")
        while state.phase < len(self.phases):
            phase = self.phases[state.phase]
            try:
                proposal = self._propose(phase, trial_id)
            except Exception as exc:  # a strategy's bug must not lose the trials that ran
                return self._failed(exc)
            if proposal == _BUDGET_USED:
                self._next_phase("its trial budget is used")
                continue
            if proposal is None:
                state.waiting = True
                self._open_start_barrier()
                return None
            if proposal == EXHAUSTED:
                self._next_phase("every setting was proposed")
                continue
            assert isinstance(proposal, Proposal)
            reused = self._reused(proposal) if proposal.reusable else None
            if reused is not None:
                self._record_reused(proposal, reused)
                if self.max_trials is not None and state.started >= self.max_trials:
                    return self._finish("iteration_limit")
                continue
            state.live[trial_id] = proposal
            state.live_phase[trial_id] = state.phase
            number = self._start_one()
            state.live_number[trial_id] = number
            return self._suggestion(proposal, number)
        return self._finish("space_exhausted")

    def _start_one(self) -> int:
        """Count a trial started in the current phase; its number."""
        state = self.state
        state.started += 1
        state.started_here += 1
        number = state.holes.pop(0) if state.holes else state.started
        state.phase_started[state.phase] += 1
        return number

    def _suggestion(self, proposal: Proposal, number: int) -> dict[str, Any]:
        """The trial config of ``proposal`` (see the class)."""
        return {
            "number": number,
            "phase": proposal.phase,
            # A staged strategy's stage (``Auto``: defaults, calibration, ...), recorded.
            "stage": proposal.stage or self._stage(self.state.phase),
            "point": proposal.point,
            "params": proposal.params,
            "settings": proposal.settings,
            "key": proposal.key,
        }

    def _propose(self, phase: Phase, trial_id: str) -> Proposal | str | None:
        """The current phase started (once) and asked for a proposal; :data:`_BUDGET_USED`
        when its trial budget is used."""
        state = self.state
        if state.begun < state.phase:
            state.begun = state.phase
            stage = self._stage(state.phase)
            if stage:
                _logger.info(
                    "search phase %d (stage %s) starts after %d finished trials",
                    state.phase,
                    stage,
                    len(self.context.records),
                )
            phase.start(self.context)  # sees every record finished so far
        if phase.budget is not None and state.phase_started[state.phase] >= phase.budget:
            return _BUDGET_USED
        return phase.propose(trial_id, self)

    def _failed(self, exc: BaseException) -> str:
        """A phase raised: the search ends (``strategy_failed``) with the trials that
        finished; an import that failed before any trial is :meth:`_missing` instead."""
        if isinstance(exc, ImportError) and not self.state.started_here:
            return self._missing(exc)
        _logger.error(
            "search phase %s failed: %s: %s; the search ends with the trials that finished",
            self._named(),
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        return self._finish("strategy_failed")

    def _missing(self, exc: ImportError) -> str:
        """A phase could not import a module before any trial started: the session is
        refused (``missing_module``) as a bad input, resumable once the module imports."""
        _logger.info("search phase %d cannot import a module: %s", self.state.phase, exc)
        self.missing_module = exc
        return self._finish("missing_module")

    def _stage(self, position: int | None) -> str | None:
        """The stage of the phase at ``position`` (None: not a staged strategy's)."""
        return None if position is None else getattr(self.phases[position], "stage", None)

    def _named(self) -> str:
        """The current phase in the log: its number, and its stage if it has one."""
        stage = self._stage(self.state.phase)
        return f"{self.state.phase}" + (f" (stage {stage})" if stage else "")

    def _next_phase(self, why: str) -> None:
        _logger.info("search phase %s ends: %s", self._named(), why)
        self.state.phase += 1

    def _finish(self, reason: str) -> str:
        if self.state.finish_reason is None:
            _logger.info("no more trials: %s (%d started)", reason, self.state.started)
        self.state.finish_reason = reason
        return Searcher.FINISHED

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        state = self.state
        proposal = state.live.pop(trial_id, None)
        position = state.live_phase.pop(trial_id, None)
        number = state.live_number.pop(trial_id, None)
        state.waiting = False
        if proposal is None:
            return
        state.finished_ids.add(trial_id)
        if proposal.reusable and not error:
            self._keep_reusable(proposal, reported_record(result), trial_id)
        self._completed(trial_id, proposal, position, number, result, error)

    def save(self, checkpoint_path: str) -> None:
        """Nothing: a resume rebuilds the searcher from the journal."""
