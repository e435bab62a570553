"""Optuna's samplers fitted to a phase of a search (:func:`make_sampler`), and
:func:`quiet_optuna`.

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

__all__ = [
    "make_sampler",
    "population_size",
    "quiet_optuna",
    "startup_trials",
    "sampler_algo",
    "check_sampler_options",
]

#: The Optuna sampler class (in ``optuna.samplers``) behind each sampler strategy.
SAMPLER_CLASSES: dict[str, str] = {
    "TPE": "TPESampler",
    "Random": "RandomSampler",
    "CmaEs": "CmaEsSampler",
    "GPS": "GPSampler",
    "NSGAII": "NSGAIISampler",
    "QMC": "QMCSampler",
}
#: ``search_algo`` of an Optuna sampler given from Python that is none of those classes.
GIVEN_SAMPLER = "Sampler"

_PRELOAD: dict[str, tuple[str, ...]] = {
    "CmaEs": ("cmaes",),
    "GPS": ("torch", "scipy.stats.qmc", "scipy.optimize"),
    "QMC": ("scipy.stats.qmc",),
}
#: Start-up trials with a budget: a tenth of it, at least 3 (:func:`startup_trials`).
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
    """Random start-up trials before a sampler's model, for a phase of ``budget`` trials: a
    tenth of it, at least 3 and at most ``default`` (``default`` without a budget).

    Example:
        >>> [startup_trials(b) for b in (None, 8, 30, 45, 100, 500)]
        [10, 3, 3, 4, 10, 10]
    """
    if budget is None or budget <= 0:
        return default
    return min(default, max(_MIN_STARTUP, budget // _STARTUP_SHARE))


def population_size(budget: int | None, default: int = 50) -> int:
    """NSGA-II's population for ``budget`` trials: a quarter of it, four generations (at least
    2, the crossover's parents; at most ``default``).

    Example:
        >>> [population_size(b) for b in (None, 4, 30, 400)]
        [50, 2, 7, 50]
    """
    if budget is None or budget <= 0:
        return default
    return min(default, max(2, budget // _GENERATIONS))


def sampler_class(algo: str) -> Any:
    """The Optuna sampler class of the sampler strategy ``algo``.

    Example:
        >>> sampler_class("TPE").__name__
        'TPESampler'
    """
    import optuna

    return getattr(optuna.samplers, SAMPLER_CLASSES[algo])


def sampler_algo(sampler: Any) -> str:
    """The sampler strategy an Optuna sampler runs as: the built-in one whose class it is (a
    subclass too), else :data:`GIVEN_SAMPLER`.

    Example:
        >>> import optuna
        >>> sampler_algo(optuna.samplers.TPESampler(seed=3))
        'TPE'
        >>> class Mine(optuna.samplers.RandomSampler): ...
        >>> sampler_algo(Mine()), sampler_algo(optuna.samplers.PartialFixedSampler({}, Mine()))
        ('Random', 'Sampler')
    """
    for algo in SAMPLER_CLASSES:
        if isinstance(sampler, sampler_class(algo)):
            return algo
    return GIVEN_SAMPLER


def check_sampler_options(algo: str, options: Any, key: str = "sampler_options") -> dict[str, Any]:
    """``options`` (the config's ``sampler_options``) as keyword arguments of ``algo``'s
    sampler: each named in its signature, of its annotated type, and the sampler built with
    them once, so a bad value is refused when the config is read.

    Raises:
        ConfigError: not a mapping, an unknown name, a wrong type, or a value it refuses.

    Example:
        >>> check_sampler_options("TPE", {"multivariate": True, "n_startup_trials": 5})
        {'multivariate': True, 'n_startup_trials': 5}
        >>> try:
        ...     check_sampler_options("TPE", {"multivarite": True})
        ... except ConfigError as exc:
        ...     print(exc.message)
        TPESampler takes no argument 'multivarite' (did you mean 'multivariate'?)
    """
    import inspect

    import optuna

    from raysearch.errors import suggest
    from raysearch.signatures import parameter_types, wrong_value

    if not isinstance(options, dict):
        raise ConfigError(key, f"expected a mapping of the sampler's arguments, got {options!r}")
    cls = sampler_class(algo)
    params = inspect.signature(cls.__init__).parameters
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [n for n, p in params.items() if n != "self" and p.kind in keyword]
    types = parameter_types(cls.__init__)
    for name, value in options.items():
        if name not in names:
            raise ConfigError(
                f"{key}.{name}",
                f"{cls.__name__} takes no argument {name!r}" + suggest(str(name), names),
            )
        wrong = wrong_value(value, types.get(name, Any))
        if wrong is not None:
            raise ConfigError(f"{key}.{name}", f"{cls.__name__}'s {name} takes {wrong}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            cls(**options)
        except Exception as exc:
            raise ConfigError(key, f"{cls.__name__}({_call(options)}): {exc}") from None
    return dict(options)


def _call(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


def make_sampler(
    algo: str,
    seed: int | None = None,
    *,
    budget: int | None = None,
    concurrent: int = 1,
    options: dict[str, Any] | None = None,
) -> Any:
    """The Optuna sampler for ``algo``, seeded with ``seed``, fitted to a phase of ``budget``
    trials (None: no limit) of which up to ``concurrent`` run at once; ``options`` (the
    config's ``sampler_options``) replace what the fitting chose, argument by argument.

    TPE and GPS run :func:`startup_trials` random trials first (Optuna's fixed 10 spends a
    third of a 30-trial search at random); TPE is multivariate, with ``constant_liar`` when
    trials run at once so that concurrent proposals do not repeat a running setting; NSGA-II's
    population is :func:`population_size`, so the budget holds several generations.
    Example:
        >>> type(make_sampler("TPE", seed=0)).__name__
        'TPESampler'
        >>> make_sampler("TPE", seed=0, budget=30)._n_startup_trials
        3
        >>> tpe = make_sampler("TPE", seed=0, budget=30, options={"n_startup_trials": 5})
        >>> tpe._n_startup_trials
        5
    """
    import optuna

    check_strategy_available(algo)
    # Imported now, not inside the first suggestion (Tune warns when one takes seconds).
    for module in _PRELOAD.get(algo, ()):
        importlib.import_module(module)
    if algo not in SAMPLER_CLASSES:
        raise ConfigError("search_algo", f"{algo!r} is not an Optuna sampler")
    arguments = {**_fitted(algo, seed, budget, concurrent), **(options or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return sampler_class(algo)(**arguments)


def _fitted(algo: str, seed: int | None, budget: int | None, concurrent: int) -> dict[str, Any]:
    """The arguments :func:`make_sampler` fits ``algo``'s sampler with."""
    fitted: dict[str, dict[str, Any]] = {
        "TPE": {
            "n_startup_trials": startup_trials(budget),
            "multivariate": True,
            "constant_liar": concurrent > 1,
        },
        "CmaEs": {"warn_independent_sampling": False},
        "GPS": {
            "n_startup_trials": startup_trials(budget),
            "deterministic_objective": True,
            "warn_independent_sampling": False,
        },
        "NSGAII": {"population_size": population_size(budget)},
        "QMC": {"warn_independent_sampling": False},
    }
    return {"seed": seed, **fitted.get(algo, {})}
