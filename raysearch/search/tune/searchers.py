"""Where the settings of a search come from: the phases of a strategy (Grid, or an Optuna
sampler inside Tune's ``OptunaSearch``, or any strategy registered in :mod:`raysearch.strategies`),
wrapped in one Ray Tune ``Searcher`` that never runs a setting twice.

:class:`SettingSearcher` is the searcher Tune sees. It runs the strategy's *phases* in order;
each phase's ``start`` sees the records finished before it. ``Grid`` is one phase over every
valid setting of every space, in order; the Optuna samplers one ``OptunaSearch`` per space
(define-by-run over ``SearchSpace.sample``: a group whose ``only_if`` does not hold is never
sampled), ``stop.iteration_limit`` split evenly between the spaces, a space without it run
until exhausted. What it reads of a finished trial is :mod:`raysearch.search.tune._told`.

Across all phases a setting (its nested settings as canonical JSON) runs at most once. When a
sampler proposes a setting that already finished, the searcher tells the sampler the known
result and asks again, without starting a trial; when it proposes one that is running, it tells
the sampler that proposal failed and asks again. A finite space whose settings were all seen
ends its phase (``space_exhausted`` when it was the last).

A ``reusable`` proposal (``WeightOnly``'s sensitivity probes) whose result an earlier search
of the same content kept (the session's probe cache,
:mod:`raysearch.search.record.probe_cache`) runs no trial: the searcher journals that result
through the recorder as a trial of its own number (``reused_<number>``, ``reused_from``), tells
the phase, and asks it again; it counts as a trial started, as on resume. A reusable trial
that completes is kept there for later searches.

The searcher also caps the number of trials *started* at ``stop.iteration_limit`` and keeps at
most ``max_outstanding`` trials suggested but unfinished (running plus queued, so that Tune
always has a queued trial to hand a finished actor to; see :mod:`raysearch.search.runner`).

Example:
    >>> from raysearch.space import SearchSpace
    >>> space = SearchSpace.parse({"per_channel": [True, False]})
    >>> searcher = SettingSearcher.grid([space], mode="min")
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

from raysearch.ranking import is_candidate, is_probe, stopped_at_rung
from raysearch.search.record.reported import reported_record
from raysearch.search.tune._told import candidacy, metric_value, objective_value, sampler_values
from raysearch.space import SearchSpace
from raysearch.space.space import Reject
from raysearch.strategies import (
    EXHAUSTED,
    Phase,
    Proposal,
    StrategyContext,
    get_strategy,
)
from raysearch.strategies.grid import GridPhase, grid_strategy
from raysearch.strategies.samplers import (
    ALGO_REQUIREMENTS,
    SAMPLER_ALGOS,
    OptunaPhase,
    check_algo_available,
    make_sampler,
    quiet_optuna,
    sampler_strategy,
)

__all__ = [
    "SettingSearcher",
    "GridPhase",
    "OptunaPhase",
    "SAMPLER_ALGOS",
    "ALGO_REQUIREMENTS",
    "check_algo_available",
    "make_sampler",
    "quiet_optuna",
    "grid_strategy",
    "sampler_strategy",
]

_logger = logging.getLogger(__name__)

#: What :meth:`SettingSearcher._propose` returns when the phase's trial budget is used.
_BUDGET_USED = "budget_used"


# -- the Tune searcher ---------------------------------------------------------------------------
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
    #: The numbers a resumed search gives its next trials first, in order: those of trials
    #: started before the interruption that did not finish (the phases
    #: propose those settings again first, so each gets back the number it had and ties
    #: between records go where they went in the uninterrupted search).
    holes: list[int] = field(default_factory=list)


class SettingSearcher(Searcher):
    """Ray Tune ``Searcher`` over the phases of a search (see the module docstring).

    Each suggestion is a trial config ``{"number", "phase", "stage", "point", "params",
    "settings", "key"}``: ``params`` is ``space.canonical(point)[0]`` (what is recorded),
    ``settings`` is ``space.to_settings(point)`` (what the trial runs), ``key`` their identity,
    ``stage`` a staged strategy's stage (None for the others).

    Build one with :meth:`from_strategy` (any registered strategy), or :meth:`grid` /
    :meth:`sampler`. :meth:`add_finished` tells it about trials finished outside Tune's
    knowledge (journal records on resume); every finished record also lands in
    ``context.records``, which the phases see.
    """

    def __init__(
        self,
        phases: Sequence[Phase],
        *,
        mode: str,
        max_trials: int | None = None,
        max_outstanding: int = 0,
        session_key: str | None = None,
        context: StrategyContext | None = None,
    ) -> None:
        super().__init__(metric="metric", mode=mode)
        self.phases = list(phases)
        self.context = context or StrategyContext([], mode=mode, max_trials=max_trials)
        #: The search's id, to find its live session (probe cache, start barrier, recorder);
        #: see :mod:`raysearch.search.tune.session`.
        self.session_key = session_key
        self.max_trials = max_trials if max_trials and max_trials > 0 else None
        self.max_outstanding = max_outstanding
        self.state = _State(phase_started=[0] * len(phases))
        #: key -> metric (None when the trial failed) of every finished setting.
        self.done: dict[str, float | None] = {}
        #: key -> what the samplers optimise (the trial's ``objective``, else its metric).
        self.objectives: dict[str, float | None] = {}
        #: key -> each of ``context.objectives``' values (the objective in the metric's
        #: place), kept when there are several: what a multi-objective sampler is told.
        self.values: dict[str, tuple[float, ...] | None] = {}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_strategy(
        cls, name: str, context: StrategyContext, *, max_outstanding: int = 0
    ) -> SettingSearcher:
        """The phases of the strategy registered as ``name``, built from ``context``."""
        phases = list(get_strategy(name)(context))
        return cls(
            phases,
            mode=context.mode,
            max_trials=context.max_trials,
            max_outstanding=max_outstanding,
            context=context,
        )

    @classmethod
    def grid(
        cls,
        spaces: Sequence[SearchSpace],
        *,
        mode: str,
        reject: Reject | None = None,
        max_trials: int | None = None,
        max_outstanding: int = 0,
    ) -> SettingSearcher:
        """Grid search over every valid setting of ``spaces``, in order, each once."""
        context = StrategyContext(spaces, mode=mode, reject=reject, max_trials=max_trials)
        return cls.from_strategy("Grid", context, max_outstanding=max_outstanding)

    @classmethod
    def sampler(
        cls,
        algo: str,
        spaces: Sequence[SearchSpace],
        *,
        mode: str,
        seed: int | None = None,
        reject: Reject | None = None,
        max_trials: int | None = None,
        max_outstanding: int = 0,
    ) -> SettingSearcher:
        """One ``OptunaSearch`` phase per space with the sampler of ``algo``; space ``i`` is
        seeded with ``seed + i``."""
        context = StrategyContext(
            spaces, mode=mode, seed=seed, reject=reject, max_trials=max_trials
        )
        return cls.from_strategy(algo, context, max_outstanding=max_outstanding)

    # -- what is known ---------------------------------------------------------------------
    @property
    def _several(self) -> bool:
        """Whether the samplers are told several objectives' values (``values``)."""
        return len(getattr(self.context, "objectives", ())) > 1

    @property
    def live_keys(self) -> set[str]:
        return {p.key for p in self.state.live.values()}

    @property
    def known_keys(self) -> set[str]:
        return set(self.done) | self.live_keys

    def knows(self, key: str) -> bool:
        # Not ``key in self.known_keys``: that copies every finished key, and this is asked
        # once per setting, so a large grid would cost the driver time quadratic in its size.
        return key in self.done or any(p.key == key for p in self.state.live.values())

    @property
    def finish_reason(self) -> str | None:
        """``iteration_limit`` or ``space_exhausted`` once no more trials will be suggested."""
        return self.state.finish_reason

    @property
    def n_started(self) -> int:
        return self.state.started

    def add_finished(self, records: Sequence[dict[str, Any]]) -> int:
        """Tell the search the trials of earlier sessions (the journal's records: ``trial_id``,
        ``key``, ``phase``, ``metric``, ...), before its first suggestion: they count as
        started, their settings as done, and the phases see them in ``context.records``.
        Returns how many were new."""
        new = 0
        for record in records:
            trial_id = str(record.get("trial_id"))
            if trial_id in self.state.finished_ids:
                continue
            self.state.finished_ids.add(trial_id)
            self.state.started += 1
            phase = int(record.get("phase") or 0)
            if 0 <= phase < len(self.state.phase_started):
                self.state.phase_started[phase] += 1
            key = record.get("key")
            if key is not None:
                self.done[key] = metric_value(record.get("metric"))
                self.objectives[key] = objective_value(record, self.done[key])
                if self._several:
                    self.values[key] = sampler_values(
                        record, self.objectives[key], self.context.objectives
                    )
            self.context.records.append(dict(record))
            new += 1
        if new:
            self._find_holes()
        return new

    def _find_holes(self) -> None:
        """The trial numbers below the highest one known that no finished or live trial
        holds (``_State.holes``)."""
        used = {r.get("number") for r in self.context.records}
        used |= set(self.state.live_number.values())
        numbers = {n for n in used if isinstance(n, int) and not isinstance(n, bool)}
        self.state.holes = [n for n in range(1, max(numbers, default=0) + 1) if n not in numbers]

    # -- Searcher interface ----------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        state = self.state
        if state.finish_reason is not None:
            return Searcher.FINISHED
        if self.max_outstanding and len(state.live) >= self.max_outstanding:
            return None
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

    # -- results kept across searches (the probe cache) ------------------------------------
    def _probe_cache(self) -> Any:
        from raysearch.search.tune.session import lookup

        session = lookup(self.session_key) if self.session_key is not None else None
        return None if session is None else session.probe_cache

    def _reused(self, proposal: Proposal) -> dict[str, Any] | None:
        """An earlier search's result of ``proposal`` (a ``reusable`` one), or None."""
        cache = self._probe_cache()
        return None if cache is None else cache.lookup(proposal.settings)

    def _record_reused(self, proposal: Proposal, record: dict[str, Any]) -> None:
        """Journal ``record`` as a trial of ``proposal`` that no actor runs, and tell the
        phase, as when a trial of it finishes."""
        from raysearch.search.tune.session import lookup

        session = lookup(str(self.session_key))
        assert session is not None  # a probe cache is a session's
        position = self.state.phase
        number = self._start_one()
        trial_id = f"reused_{number:05d}"
        full = session.recorder.record_reused(trial_id, self._suggestion(proposal, number), record)
        self.state.finished_ids.add(trial_id)
        # the progress line counts it with the trials that ran (a probe: never its best)
        metric = None if is_probe(full) else full.get("metric")
        session.progress.trial_finished(full["status"], metric, is_candidate(full))
        result = {"metric": full.get("metric"), "objective": full.get("objective"), "trial": full}
        self._completed(trial_id, proposal, position, number, result, False)

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
        """A phase raised: the search ends (``strategy_failed``) once the trials running
        finish, and its outputs are written from every trial that finished."""
        stage = self._stage(self.state.phase)
        named = f" (stage {stage})" if stage else ""
        _logger.error(
            "search phase %d%s failed: %s: %s; the search ends with the trials that finished",
            self.state.phase,
            named,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        return self._finish("strategy_failed")

    def _open_start_barrier(self) -> None:
        """The phase waits for results: no other actor starts before they come, so the
        actors already started must not wait for one (see ``StartBarrier``)."""
        from raysearch.search.tune.session import lookup

        session = lookup(self.session_key) if self.session_key is not None else None
        if session is not None and session.start_barrier is not None:
            session.start_barrier.open()
            session.start_barrier = None

    def _stage(self, position: int | None) -> str | None:
        """The stage of the phase at ``position`` (None: not a staged strategy's)."""
        return None if position is None else getattr(self.phases[position], "stage", None)

    def _next_phase(self, why: str) -> None:
        stage = self._stage(self.state.phase)
        named = f" (stage {stage})" if stage else ""
        _logger.info("search phase %d%s ends: %s", self.state.phase, named, why)
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
            cache = self._probe_cache()
            if cache is not None:  # kept for later searches of the same content
                cache.store(proposal.settings, reported_record(result), trial_id)
        self._completed(trial_id, proposal, position, number, result, error)

    def _completed(
        self,
        trial_id: str,
        proposal: Proposal,
        position: int | None,
        number: int | None,
        result: dict[str, Any] | None,
        error: bool,
    ) -> None:
        """What the search learns of a finished trial of ``proposal``: its metric and
        objective by key, its record in ``context.records``, and the phase told."""
        metric = None if (error or not result) else metric_value(result.get("metric"))
        objective = None if (error or not result) else objective_value(result, metric)
        self.done[proposal.key] = metric
        self.objectives[proposal.key] = objective
        reported = reported_record(result)
        told: dict[str, Any] = {"objective": objective}
        if self._several:
            values = sampler_values(reported or result or {}, objective, self.context.objectives)
            self.values[proposal.key] = told["values"] = values
        candidate, extra = candidacy(None if error else result)
        self.context.records.append(
            {
                "trial_id": trial_id,
                # Ties between records go to the trial started first, as in the outputs
                # (best_record): a phase refines around the trial best/ will hold.
                "number": number,
                "key": proposal.key,
                "phase": proposal.phase,
                "stage": proposal.stage or self._stage(position),
                "params": proposal.params,
                "settings": proposal.settings,
                "metric": metric,
                "objective": objective,
                "status": "failed" if error or metric is None else "ok",
                "is_candidate": candidate and metric is not None,
                "extra": extra,
                "stopped_at_rung": None if error else stopped_at_rung(reported or result or {}),
                # a phase may weigh size (the weight-only strategy's base), as the
                # journal's records have it
                "model_size_bytes": None if error else (reported or {}).get("model_size_bytes"),
                # a result an earlier search measured (the probe cache), no trial run
                "reused_from": (reported or {}).get("reused_from"),
            }
        )
        if position is not None and self.state.finish_reason != "strategy_failed":
            # ``values`` only with several objectives: a plugin's phase written for one
            # objective need not take it.
            try:
                self.phases[position].completed(proposal, metric, error, **told)
            except Exception as exc:  # as in suggest: the trials that ran are kept
                self._failed(exc)

    def save(self, checkpoint_path: str) -> None:
        """Nothing: the journal is the search's record, and a resume rebuilds the searcher
        from it (Tune's copy of a searcher is never read, so none is written)."""
