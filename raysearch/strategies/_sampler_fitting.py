"""Optuna's samplers fitted to a phase of a search (:func:`make_sampler`): start-up trials and
NSGA-II's population scaled to the phase's budget, TPE's constant liar when trials run at
once; and :func:`quiet_optuna`. The phases that use them are in
:mod:`raysearch.strategies.samplers`.

Example:
    >>> type(make_sampler("TPE", seed=0)).__name__
    'TPESampler'
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

from raysearch.errors import ConfigError
from raysearch.strategies._registry import check_strategy_available

__all__ = ["make_sampler", "population_size", "quiet_optuna", "startup_trials"]

_PRELOAD: dict[str, tuple[str, ...]] = {
    "CmaEs": ("cmaes",),
    "GPS": ("torch", "scipy.stats.qmc", "scipy.optimize"),
    "QMC": ("scipy.stats.qmc",),
}
#: Start-up trials with a budget: a tenth of it, at least 3 (:func:`startup_trials`). Measured
#: by ``benchmarks/search_efficiency.py`` (336-setting conditional space, 30 trials, median
#: trials to the first candidate over seeds 0-99 / 100-199): 3 start-up trials 8 / 7, 2 8 / 7,
#: 6 (a fifth) 8 / 9, Optuna's 10 10.5 / 11.
_STARTUP_SHARE = 10
_MIN_STARTUP = 3
#: NSGA-II: the generations a budget should hold (:func:`population_size`).
_GENERATIONS = 4


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


def startup_trials(budget: int | None, default: int = 10) -> int:
    """How many random start-up trials a sampler runs before its model, for a phase of
    ``budget`` trials: Optuna's ``default`` without a budget; else a tenth of the budget, at
    least 3 and never more than ``default`` (see :data:`_STARTUP_SHARE`).

    Example:
        >>> [startup_trials(b) for b in (None, 8, 30, 45, 100, 500)]
        [10, 3, 3, 4, 10, 10]
    """
    if budget is None or budget <= 0:
        return default
    return min(default, max(_MIN_STARTUP, budget // _STARTUP_SHARE))


def population_size(budget: int | None, default: int = 50) -> int:
    """NSGA-II's population for ``budget`` trials: Optuna's ``default`` (50) leaves a 30-trial
    phase inside its random first generation; a quarter of the budget gives it four
    generations (at least 2, the crossover's parents; never more than ``default``).

    Example:
        >>> [population_size(b) for b in (None, 4, 30, 400)]
        [50, 2, 7, 50]
    """
    if budget is None or budget <= 0:
        return default
    return min(default, max(2, budget // _GENERATIONS))


def make_sampler(
    algo: str, seed: int | None = None, *, budget: int | None = None, concurrent: int = 1
) -> Any:
    """The Optuna sampler for ``algo`` (one of :data:`SAMPLER_ALGOS`), seeded with ``seed``,
    fitted to a phase of ``budget`` trials (None: no limit) of which up to ``concurrent``
    run at once.

    - ``TPE``: :func:`startup_trials` random trials before the Parzen estimators (Optuna's
      10 whatever the budget spent a third of a 30-trial search at random), the multivariate
      TPE (one joint model of the parameters that every trial has; the installed Optuna's
      default for one objective, set explicitly) and ``constant_liar`` when ``concurrent > 1``:
      a running trial (RUNNING in the study: Tune's ``OptunaSearch`` asks a trial per
      suggestion and tells it when the trial ends) counts as a bad result, so concurrent
      proposals do not repeat a running setting (Optuna's advice for parallel
      optimisation). ``group=True`` (a joint model per group of parameters that occur
      together) is not set: on the conditional space of
      ``benchmarks/search_efficiency.py`` it measured no better.
    - ``GPS``: :func:`startup_trials` random trials before the Gaussian process. Optuna's
      GPSampler has no constant liar: a concurrent proposal that repeats a running setting
      is answered as failed by the phase and asked again.
    - ``CmaEs``: Optuna's single start-up trial (its start-up trials do not seed the search
      distribution, so more of them would only be random ones); ``restart_strategy`` is
      deprecated in Optuna and not set.
    - ``NSGAII``: a population of :func:`population_size` so that the budget holds several
      generations.
    - ``Random``, ``QMC``: nothing to fit.

    Parameters a sampler cannot model jointly (a categorical for CMA-ES, GP and QMC, or a
    parameter outside the space every finished trial shares) are drawn by its independent
    sampler, a ``RandomSampler`` with the same seed. Optuna's ExperimentalWarning about these
    arguments is silenced.

    Example:
        >>> type(make_sampler("TPE", seed=0)).__name__
        'TPESampler'
        >>> make_sampler("TPE", seed=0, budget=30)._n_startup_trials
        3
    """
    import optuna

    check_strategy_available(algo)
    # Import what the sampler needs now, not inside its first suggestion (Tune warns when a
    # define-by-run call takes seconds).
    for module in _PRELOAD.get(algo, ()):
        importlib.import_module(module)
    samplers = optuna.samplers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(samplers, algo, seed, budget, concurrent)


def _sampler(
    samplers: Any, algo: str, seed: int | None, budget: int | None, concurrent: int
) -> Any:
    if algo == "TPE":
        return samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup_trials(budget),
            multivariate=True,
            constant_liar=concurrent > 1,
        )
    if algo == "Random":
        return samplers.RandomSampler(seed=seed)
    if algo == "CmaEs":
        return samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if algo == "GPS":
        return samplers.GPSampler(
            seed=seed,
            n_startup_trials=startup_trials(budget),
            deterministic_objective=True,
            warn_independent_sampling=False,
        )
    if algo == "NSGAII":
        return samplers.NSGAIISampler(seed=seed, population_size=population_size(budget))
    if algo == "QMC":
        return samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    raise ConfigError("search_algo", f"{algo!r} is not an Optuna sampler")
