"""Where the settings of a search come from: Grid, or an Optuna sampler inside Tune's
``OptunaSearch``, wrapped in one Ray Tune ``Searcher`` that never runs a setting twice.

:class:`SettingSearcher` is the searcher Tune sees. It runs *phases* in order, one per search
space (``search_spaces: [a, b]``):

- ``Grid``: one phase over every valid setting of every space, in order
  (:meth:`SearchSpace.expand` with the backend's ``reject``, duplicates across spaces dropped).
- ``TPE``, ``Random``, ``CmaEs``, ``GPS``, ``NSGAII``, ``QMC``: one ``OptunaSearch`` per space
  with the matching Optuna sampler and ``space=SearchSpace.sample`` (define-by-run: a group
  whose ``only_if`` does not hold is never sampled). With ``stop.iteration_limit`` the trials
  are split evenly between the spaces (earlier spaces get the remainder); without it a space
  runs until it is exhausted (every distinct setting of a finite space seen), so a later space
  is reached only after a finite earlier one.

Across all phases a setting (its nested settings as canonical JSON) runs at most once. When a
sampler proposes a setting that already finished, the searcher tells the sampler the known
result and asks again, without starting a trial; when it proposes one that is running, it tells
the sampler that proposal failed and asks again. A finite space whose settings were all seen
ends its phase (``space_exhausted`` when it was the last).

The searcher also caps the number of trials *started* at ``stop.iteration_limit`` and keeps at
most ``max_outstanding`` trials suggested but unfinished (running plus queued, so that Tune
always has a queued trial to hand a finished actor to; see :mod:`raysearch.search.runner`).

Example:
    >>> from raysearch.space import SearchSpace
    >>> space = SearchSpace.parse({"per_channel": [True, False]})
    >>> searcher = SettingSearcher.grid([space], mode="min")
    >>> [searcher.suggest(str(i))["params"] for i in range(2)]
    [{'per_channel': True}, {'per_channel': False}]
    >>> searcher.suggest("2") is None   # both are running; nothing new until one finishes
    True
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import pickle
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.tune.search import Searcher

from raysearch.errors import ConfigError
from raysearch.space import SearchSpace, expand_spaces, settings_key
from raysearch.space.space import Reject

__all__ = [
    "SettingSearcher",
    "SAMPLER_ALGOS",
    "ALGO_REQUIREMENTS",
    "check_algo_available",
    "make_sampler",
    "quiet_optuna",
]

_logger = logging.getLogger(__name__)

#: Search algorithms run as Optuna samplers.
SAMPLER_ALGOS = ("TPE", "Random", "CmaEs", "GPS", "NSGAII", "QMC")
#: Python packages each sampler needs beyond optuna itself (import names).
ALGO_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "CmaEs": ("cmaes",),
    "GPS": ("torch", "scipy"),
    "QMC": ("scipy",),
}
_PRELOAD: dict[str, tuple[str, ...]] = {
    "CmaEs": ("cmaes",),
    "GPS": ("torch", "scipy.stats.qmc", "scipy.optimize"),
    "QMC": ("scipy.stats.qmc",),
}
#: Proposals in a row that may repeat known settings before a phase counts as exhausted.
_MAX_ASKS = 64


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs every study and trial at INFO; raysearch reports trials itself."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def check_algo_available(algo: str) -> None:
    """Raise :class:`ConfigError` (key ``search_algo``) when ``algo`` needs a package that is
    not installed.

    Example:
        >>> check_algo_available("TPE")
    """
    missing = [m for m in ALGO_REQUIREMENTS.get(algo, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            "search_algo",
            f"{algo} needs the package(s) {', '.join(missing)}, which are not installed "
            f"(pip install {' '.join(missing)}); or choose TPE, Random, NSGAII or Grid",
        )


def make_sampler(algo: str, seed: int | None = None) -> Any:
    """The Optuna sampler for ``algo`` (one of :data:`SAMPLER_ALGOS`), seeded with ``seed``.

    Parameters a sampler cannot model jointly (a conditional group, or a categorical for
    CMA-ES) are drawn by its independent sampler, a ``RandomSampler`` with the same seed.

    Example:
        >>> type(make_sampler("TPE", seed=0)).__name__
        'TPESampler'
    """
    import optuna

    check_algo_available(algo)
    # Import what the sampler needs now, not inside its first suggestion (Tune warns when a
    # define-by-run call takes seconds).
    for module in _PRELOAD.get(algo, ()):
        importlib.import_module(module)
    samplers = optuna.samplers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(samplers, algo, seed)


def _sampler(samplers: Any, algo: str, seed: int | None) -> Any:
    if algo == "TPE":
        return samplers.TPESampler(seed=seed)
    if algo == "Random":
        return samplers.RandomSampler(seed=seed)
    if algo == "CmaEs":
        return samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if algo == "GPS":
        return samplers.GPSampler(
            seed=seed, deterministic_objective=True, warn_independent_sampling=False
        )
    if algo == "NSGAII":
        return samplers.NSGAIISampler(seed=seed)
    if algo == "QMC":
        return samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    raise ConfigError("search_algo", f"{algo!r} is not an Optuna sampler")


# -- proposals and phases ------------------------------------------------------------------------
@dataclass
class _Proposal:
    phase: int
    point: dict[str, Any]
    params: dict[str, Any]
    settings: dict[str, Any]
    key: str
    inner_id: str | None = None


_EXHAUSTED = "EXHAUSTED"


class _Phase:
    """Proposes settings from one source; ``budget`` caps how many trials it may start."""

    budget: int | None = None

    def propose(self, trial_id: str, searcher: SettingSearcher) -> _Proposal | str | None:
        raise NotImplementedError

    def completed(self, proposal: _Proposal, metric: float | None, error: bool) -> None:
        """The trial of ``proposal`` finished: ``error`` when it raised or crashed, ``metric``
        None when it failed (the sampler then counts it as pruned: a bad region)."""


class _GridPhase(_Phase):
    """Every valid setting of the spaces, in order, each once."""

    def __init__(self, spaces: Sequence[SearchSpace], reject: Reject | None) -> None:
        grid = expand_spaces(spaces, reject)
        self.items: list[tuple[int, dict[str, Any]]] = list(zip(grid.space_index, grid.points))
        if grid.dropped.get("duplicate"):
            _logger.info("grid: %d repeated settings dropped", grid.dropped["duplicate"])
        self.spaces = list(spaces)
        self.position = 0

    def __len__(self) -> int:
        return len(self.items)

    def propose(self, trial_id: str, searcher: SettingSearcher) -> _Proposal | str | None:
        while self.position < len(self.items):
            index, point = self.items[self.position]
            self.position += 1
            proposal = _make_proposal(self.spaces[index], index, point)
            if proposal.key in searcher.known_keys:
                continue  # finished in an earlier session (resume) or queued already
            return proposal
        return _EXHAUSTED


class _OptunaPhase(_Phase):
    """One space sampled by an Optuna sampler inside Tune's ``OptunaSearch``."""

    def __init__(
        self,
        space: SearchSpace,
        index: int,
        algo: str,
        seed: int | None,
        mode: str,
        reject: Reject | None,
        budget: int | None,
    ) -> None:
        from ray.tune.search.optuna import OptunaSearch

        self.space = space
        self.index = index
        self.reject = reject
        self.budget = budget
        self.optuna = OptunaSearch(
            space=space.sample,
            metric="metric",
            mode=mode,
            sampler=make_sampler(algo, seed),
            study_name=f"raysearch-{index}",
        )
        self.size = _distinct_settings(space, reject) if not space.has_ranges else None
        self.seen: set[str] = set()
        self.asks = 0

    def propose(self, trial_id: str, searcher: SettingSearcher) -> _Proposal | str | None:
        for _ in range(_MAX_ASKS):
            if self.size is not None and len(self.seen) >= self.size:
                return _EXHAUSTED
            inner_id = f"{trial_id}~{self.asks}"
            self.asks += 1
            point = self.optuna.suggest(inner_id)
            proposal = _make_proposal(self.space, self.index, point, inner_id)
            key = proposal.key
            if key in searcher.done:
                self.seen.add(key)
                # Known result: teach the sampler, start nothing.
                self.optuna.on_trial_complete(inner_id, {"metric": searcher.done[key]})
                continue
            if key in searcher.live_keys:
                self.optuna.on_trial_complete(inner_id, None, error=True)
                continue
            reason = self.reject(proposal.settings) if self.reject else None
            if reason:
                self.seen.add(key)
                _logger.debug(
                    "%s: sampler proposed a rejected setting (%s)", self.space.name, reason
                )
                self.optuna.on_trial_complete(inner_id, None, error=True)
                continue
            self.seen.add(key)
            return proposal
        if searcher.live_keys:
            return None  # wait for a running trial to finish, then ask again
        _logger.info(
            "%s: the sampler proposed only known settings %d times in a row; phase done",
            self.space.name,
            _MAX_ASKS,
        )
        return _EXHAUSTED

    def completed(self, proposal: _Proposal, metric: float | None, error: bool) -> None:
        result = None if error else {"metric": metric}
        self.optuna.on_trial_complete(proposal.inner_id, result, error=error)


def _make_proposal(
    space: SearchSpace, index: int, point: dict[str, Any], inner_id: str | None = None
) -> _Proposal:
    params, _ = space.canonical(point)
    settings = space.to_settings(point)
    return _Proposal(index, dict(point), params, settings, settings_key(settings), inner_id)


def _distinct_settings(space: SearchSpace, reject: Reject | None, limit: int = 200_000) -> int:
    """How many distinct settings a categorical space has (valid ones only)."""
    if space.grid_size() > limit:
        return limit
    return len(expand_spaces([space], reject))


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# -- the Tune searcher ---------------------------------------------------------------------------
@dataclass
class _State:
    started: int = 0
    phase: int = 0
    phase_started: list[int] = field(default_factory=list)
    live: dict[str, _Proposal] = field(default_factory=dict)
    finished_ids: set[str] = field(default_factory=set)
    finish_reason: str | None = None
    waiting: bool = False


class SettingSearcher(Searcher):
    """Ray Tune ``Searcher`` over the phases of a search (see the module docstring).

    Each suggestion is a trial config ``{"number", "phase", "point", "params", "settings",
    "key"}``: ``params`` is ``space.canonical(point)[0]`` (what is recorded), ``settings`` is
    ``space.to_settings(point)`` (what the trial runs), ``key`` their identity.

    Use :meth:`grid` or :meth:`sampler` to build one. :meth:`add_finished` tells it about
    trials finished outside Tune's knowledge (journal records on resume).
    """

    def __init__(
        self,
        phases: list[_Phase],
        *,
        mode: str,
        max_trials: int | None = None,
        max_outstanding: int = 0,
        session_key: str | None = None,
    ) -> None:
        super().__init__(metric="metric", mode=mode)
        self.phases = phases
        #: The output folder of the search, to find its live session (and journal) after a
        #: restore; see :mod:`raysearch.search.session`.
        self.session_key = session_key
        self._attached = False
        self.max_trials = max_trials if max_trials and max_trials > 0 else None
        self.max_outstanding = max_outstanding
        self.state = _State(phase_started=[0] * len(phases))
        #: key -> metric (None when the trial failed) of every finished setting.
        self.done: dict[str, float | None] = {}

    # -- construction ----------------------------------------------------------------------
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
        return cls(
            [_GridPhase(spaces, reject)],
            mode=mode,
            max_trials=max_trials,
            max_outstanding=max_outstanding,
        )

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
        budgets: list[int | None] = [None] * len(spaces)
        if max_trials and max_trials > 0:
            budgets = list(_split(max_trials, len(spaces)))
        phases: list[_Phase] = [
            _OptunaPhase(
                space,
                i,
                algo,
                None if seed is None else seed + i,
                mode,
                reject,
                budgets[i],
            )
            for i, space in enumerate(spaces)
        ]
        return cls(phases, mode=mode, max_trials=max_trials, max_outstanding=max_outstanding)

    # -- what is known ---------------------------------------------------------------------
    @property
    def live_keys(self) -> set[str]:
        return {p.key for p in self.state.live.values()}

    @property
    def known_keys(self) -> set[str]:
        return set(self.done) | self.live_keys

    @property
    def finish_reason(self) -> str | None:
        """``iteration_limit`` or ``space_exhausted`` once no more trials will be suggested."""
        return self.state.finish_reason

    @property
    def n_started(self) -> int:
        return self.state.started

    def add_finished(self, records: Sequence[dict[str, Any]]) -> int:
        """Count trials finished outside Tune's knowledge (journal records of an interrupted
        session: ``trial_id``, ``key``, ``phase``, ``metric``). Returns how many were new."""
        new = 0
        for record in records:
            trial_id = str(record.get("trial_id"))
            if trial_id in self.state.finished_ids or trial_id in self.state.live:
                continue  # Tune knows it: it finished, or will run (and replay) it again
            self.state.finished_ids.add(trial_id)
            self.state.started += 1
            phase = int(record.get("phase") or 0)
            if 0 <= phase < len(self.state.phase_started):
                self.state.phase_started[phase] += 1
            key = record.get("key")
            if key is not None:
                self.done[key] = _metric(record.get("metric"))
            new += 1
        return new

    # -- Searcher interface ----------------------------------------------------------------
    def _attach(self) -> None:
        """Once per process: register with the live session and count the trials of its
        journal that this (possibly restored) searcher does not know about."""
        if self._attached:
            return
        self._attached = True
        if self.session_key is None:
            return
        from raysearch.search.session import lookup

        session = lookup(self.session_key)
        if session is None:
            return
        session.searcher = self
        new = self.add_finished(session.records)
        if new:
            _logger.info("searcher: %d trials finished after the last saved state", new)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        self._attach()
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
            if phase.budget is not None and state.phase_started[state.phase] >= phase.budget:
                self._next_phase("its share of the iteration limit is used")
                continue
            proposal = phase.propose(trial_id, self)
            if proposal is None:
                state.waiting = True
                return None
            if proposal == _EXHAUSTED:
                self._next_phase("every setting was proposed")
                continue
            assert isinstance(proposal, _Proposal)
            state.live[trial_id] = proposal
            state.started += 1
            state.phase_started[state.phase] += 1
            return {
                "number": state.started,
                "phase": proposal.phase,
                "point": proposal.point,
                "params": proposal.params,
                "settings": proposal.settings,
                "key": proposal.key,
            }
        return self._finish("space_exhausted")

    def _next_phase(self, why: str) -> None:
        _logger.info("search phase %d ends: %s", self.state.phase, why)
        self.state.phase += 1

    def _finish(self, reason: str) -> str:
        if self.state.finish_reason is None:
            _logger.info("no more trials: %s (%d started)", reason, self.state.started)
        self.state.finish_reason = reason
        return Searcher.FINISHED

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._attach()
        state = self.state
        proposal = state.live.pop(trial_id, None)
        state.waiting = False
        if proposal is None:
            return
        state.finished_ids.add(trial_id)
        metric = None if (error or not result) else _metric(result.get("metric"))
        self.done[proposal.key] = metric
        phase = self._phase_of(proposal)
        if phase is not None:
            phase.completed(proposal, metric, error)

    def _phase_of(self, proposal: _Proposal) -> _Phase | None:
        for phase in self.phases:
            if isinstance(phase, _OptunaPhase) and phase.index == proposal.phase:
                return phase
        return None

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as fh:
            pickle.dump({**self.__dict__, "_attached": False}, fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            self.__dict__.update(pickle.load(fh))
        # A restored experiment runs its unfinished trials again: they are live again.
        self.state.waiting = False
        self._attached = False


def _metric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
