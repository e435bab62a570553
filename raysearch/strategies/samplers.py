"""The Optuna strategies (``TPE``, ``Random``, ``CmaEs``, ``GPS``, ``NSGAII``, ``QMC``): one
``OptunaSearch`` phase per search space with the matching sampler, define-by-run over
:meth:`SearchSpace.sample`, fitted to its phase (:mod:`raysearch.strategies._sampler_fitting`).
With several ``objectives`` every sampler but CMA-ES runs Optuna's multi-objective study.

Example:
    >>> type(make_sampler("TPE", seed=0)).__name__
    'TPESampler'
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Sequence
from typing import Any

from raysearch.errors import ConfigError
from raysearch.space import SearchSpace, expand_spaces
from raysearch.space.space import Reject
from raysearch.space.tree import Categorical
from raysearch.strategies._registry import (
    BUILTIN_STRATEGIES,
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    check_strategy_available,
    register_strategy,
)
from raysearch.strategies._sampler_fitting import (
    GIVEN_SAMPLER,
    check_sampler_options,
    make_sampler,
    quiet_optuna,
    sampler_algo,
    startup_trials,
)

__all__ = [
    "SAMPLER_ALGOS",
    "ALGO_REQUIREMENTS",
    "OptunaPhase",
    "check_algo_available",
    "make_sampler",
    "quiet_optuna",
    "startup_trials",
    "sampler_strategy",
    "GIVEN_SAMPLER",
    "sampler_algo",
    "check_sampler_options",
]

_logger = logging.getLogger("raysearch.search.tune.searchers")

#: Search algorithms run as Optuna samplers (every built-in strategy but Grid).
SAMPLER_ALGOS = tuple(name for name, info in BUILTIN_STRATEGIES.items() if info.module == __name__)
#: Python packages each sampler needs beyond optuna itself (import names).
ALGO_REQUIREMENTS = {n: i.requires for n, i in BUILTIN_STRATEGIES.items() if i.requires}
#: Proposals in a row that may repeat known settings before a phase counts as exhausted.
_MAX_ASKS = 64
#: Known settings proposed in a row before the phase queues the sampler an unseen one.
_STUCK_ASKS = 8
#: Spaces up to this many settings are listed to find an unseen one.
_LISTED_LIMIT = 50_000


#: ConfigError (``search_algo``) when an algorithm needs a package that is not installed.
check_algo_available = check_strategy_available


class OptunaPhase(Phase):
    """One space sampled by an Optuna sampler inside Tune's ``OptunaSearch``: ``algo``'s
    sampler fitted to the phase (:func:`make_sampler`), or the ``sampler`` given, as it is."""

    def __init__(
        self,
        space: SearchSpace,
        index: int,
        algo: str,
        seed: int | None,
        mode: str,
        reject: Reject | None,
        budget: int | None,
        *,
        concurrent: int = 1,
        sampler: Any = None,
        objectives: Sequence[str] = ("metric",),
        options: dict[str, Any] | None = None,
    ) -> None:
        from ray.tune.search.optuna import OptunaSearch

        self.space = space
        self.objective_names = tuple(objectives)
        self.index = index
        self.reject = reject
        self.budget = budget
        starts = [self._labels(p) for p in getattr(space, "points_to_evaluate", ())]
        several = len(self.objective_names) > 1
        self.optuna = OptunaSearch(
            space=space.sample,
            metric=list(self.objective_names) if several else "metric",
            mode=[mode if n == "metric" else "min" for n in self.objective_names]
            if several
            else mode,
            sampler=(
                sampler
                if sampler is not None
                else make_sampler(algo, seed, budget=budget, concurrent=concurrent, options=options)
            ),
            study_name=f"raysearch-{index}",
            points_to_evaluate=starts or None,
        )
        #: The space's distinct valid settings, counted when the sampler first repeats
        #: itself (None with ranges).
        self.size: int | None = None
        self._counted = space.has_ranges
        self.seen: set[str] = set()
        self.asks = 0
        self.repeats = 0
        self._listed: list[tuple[str, dict[str, Any]]] | None = None
        self._rng = random.Random(seed)

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        stale = 0
        for _ in range((_MAX_ASKS + 1) * (len(search.done) + 1)):
            if stale >= _MAX_ASKS:
                break
            if self.size is not None and len(self.seen) >= self.size:
                return EXHAUSTED
            if self.repeats >= _STUCK_ASKS:
                self._queue_unseen()
            inner_id = f"{trial_id}~{self.asks}"
            self.asks += 1
            point = self.optuna.suggest(inner_id)
            proposal = Proposal.of(self.space, self.index, point, inner_id)
            known = proposal.key in self.seen
            if self._answered(proposal, search):
                if not known and proposal.key in search.done:
                    # Catching up: a resumed sampler proposes again what it proposed before
                    # the interruption; told its result, it does not count as stuck.
                    self.repeats = 0
                    stale = 0
                    continue
                stale += 1
                self.repeats += 1
                if not self._counted:
                    self._counted = True
                    self.size = _distinct_settings(self.space, self.reject)
                continue
            self.repeats = 0
            self.seen.add(proposal.key)
            return proposal
        if search.live_keys:
            return None  # wait for a running trial to finish, then ask again
        _logger.info(
            "%s: the sampler proposed only known settings %d times in a row; phase done",
            self.space.name,
            _MAX_ASKS,
        )
        return EXHAUSTED

    def _queue_unseen(self) -> None:
        """Queue the sampler (``study.enqueue_trial``) a valid setting not yet seen, at
        random, when it keeps proposing settings that already ran (TPE settles on a few of a
        small categorical space), so the budget goes to the space rather than to repeats."""
        self.repeats = 0
        if self.space.has_ranges or self.space.grid_size() > _LISTED_LIMIT:
            return
        if self._listed is None:
            points = expand_spaces([self.space], self.reject).points
            self._listed = [(Proposal.of(self.space, self.index, p, "").key, p) for p in points]
        unseen = [point for key, point in self._listed if key not in self.seen]
        if unseen:
            self.optuna._ot_study.enqueue_trial(self._labels(self._rng.choice(unseen)))

    def _labels(self, point: dict[str, Any]) -> dict[str, Any]:
        """``point`` as Optuna's parameters: a choice by its label, a range's value as it is."""
        params = {}
        for param in self.space.params:
            domain = param.domain
            if param.name not in point or domain.is_fixed:
                continue
            value = point[param.name]
            if isinstance(domain, Categorical):
                value = domain.labels[domain.choices.index(value)]
            params[param.name] = value
        return params

    def _answered(self, proposal: Proposal, search: SearchView) -> bool:
        """Whether ``proposal`` needs no trial: it finished (the sampler is told its result),
        is running, or the backend refuses it (told as failed)."""
        key, inner_id = proposal.key, proposal.inner_id
        if key in search.done:
            self.seen.add(key)
            known = search.objectives.get(key)
            values = search.values.get(key) if self._several else None
            self._tell(inner_id, known, values, error=False)
            return True
        if key in search.live_keys:
            self.optuna.on_trial_complete(inner_id, None, error=True)
            return True
        reason = self.reject(proposal.settings) if self.reject else None
        if reason:
            # Not in ``seen``: ``size`` counts the valid settings only.
            _logger.debug("%s: sampler proposed a rejected setting (%s)", self.space.name, reason)
            self.optuna.on_trial_complete(inner_id, None, error=True)
            return True
        return False

    def completed(
        self,
        proposal: Proposal,
        metric: float | None,
        error: bool,
        *,
        objective: float | None = None,
        values: tuple[float, ...] | None = None,
    ) -> None:
        # The sampler optimises the objective (quantized candidates first), not the metric.
        self._tell(proposal.inner_id, metric if objective is None else objective, values, error)

    @property
    def _several(self) -> bool:
        return len(self.objective_names) > 1

    def _tell(
        self,
        inner_id: str,
        objective: float | None,
        values: tuple[float, ...] | None,
        error: bool,
    ) -> None:
        """Tell the sampler a finished proposal (with several objectives, one missing a value
        is told as failed: Optuna's multi-objective study takes no partial values)."""
        if error:
            self.optuna.on_trial_complete(inner_id, None, error=True)
        elif not self._several:
            self.optuna.on_trial_complete(inner_id, {"metric": objective})
        elif values is None or len(values) != len(self.objective_names):
            self.optuna.on_trial_complete(inner_id, None, error=True)
        else:
            self.optuna.on_trial_complete(inner_id, dict(zip(self.objective_names, values)))


def _distinct_settings(space: SearchSpace, reject: Reject | None, limit: int = 200_000) -> int:
    """How many distinct settings a categorical space has (valid ones only)."""
    if space.grid_size() > limit:
        return limit
    return len(expand_spaces([space], reject))


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def sampler_strategy(algo: str, context: StrategyContext) -> list[Phase]:
    """One ``OptunaSearch`` phase per space with the sampler of ``algo``; space ``i`` is seeded
    with ``seed + i``, ``max_trials`` is split evenly between the spaces, and an Optuna
    sampler given (``context.sampler``) serves every phase as it is."""
    sampler = getattr(context, "sampler", None)
    if algo == GIVEN_SAMPLER and sampler is None:
        raise ConfigError("search_algo", f"{GIVEN_SAMPLER} needs an Optuna sampler instance")
    options = dict(getattr(context, "sampler_options", None) or {})
    spaces = context.spaces
    budgets: list[int | None] = [None] * len(spaces)
    if context.max_trials and context.max_trials > 0:
        budgets = list(_split(context.max_trials, len(spaces)))
    seed = context.seed
    return [
        OptunaPhase(
            space,
            i,
            algo,
            None if seed is None else seed + i,
            context.mode,
            context.reject,
            b,
            concurrent=context.concurrent,
            objectives=context.objectives,
            sampler=sampler,
            options=options,
        )
        for i, (space, b) in enumerate(zip(spaces, budgets))
    ]


for _algo in SAMPLER_ALGOS:
    register_strategy(_algo)(functools.partial(sampler_strategy, _algo))
register_strategy(GIVEN_SAMPLER, listed=False)(functools.partial(sampler_strategy, GIVEN_SAMPLER))
