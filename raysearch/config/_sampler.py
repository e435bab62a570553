"""``search_algo`` as an Optuna sampler instance (run as given, named after its class's
strategy) and ``sampler_options`` (keyword arguments of the sampler a name builds, checked
against its signature; the staged strategies take none).

Example:
    >>> parse_sampler_options(None, "Auto", None)
    {}
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from raysearch.errors import ConfigError

__all__ = ["given_sampler", "algo_of", "parse_sampler_options"]

_KEY = "sampler_options"
_logger = logging.getLogger("raysearch.config")


def given_sampler(value: Any) -> Any:
    """``value`` when it is an Optuna sampler instance, else None (without importing Optuna)."""
    samplers = sys.modules.get("optuna.samplers")
    if samplers is not None and isinstance(value, samplers.BaseSampler):
        return value
    return None


def algo_of(value: Any) -> str:
    """The strategy ``search_algo`` names (a sampler instance: its sampler strategy)."""
    from raysearch.strategies import canonical_strategy
    from raysearch.strategies.samplers import GIVEN_SAMPLER, sampler_algo

    sampler = given_sampler(value)
    if sampler is not None:
        algo = sampler_algo(sampler)
        _logger.info(
            "search_algo: the Optuna sampler given (%s) runs as given (%s strategy; seed does "
            "not reseed it)",
            type(sampler).__name__,
            algo,
        )
        return algo
    refusal = _not_a_sampler(value)
    if refusal is not None:
        raise ConfigError("search_algo", refusal)
    if isinstance(value, str) and value.casefold() == GIVEN_SAMPLER.casefold():
        raise ConfigError(
            "search_algo",
            f"{GIVEN_SAMPLER} is an Optuna sampler given from Python "
            "(search_algo=optuna.samplers.TPESampler(...)); a config names TPE, GPS, ...",
        )
    return canonical_strategy(value)


#: What ``search_algo`` may be besides a name (said where a Python object is given).
_INSTANCE = "an Optuna sampler instance"
_EXAMPLE = "search_algo=optuna.samplers.TPESampler(...)"
#: Values a config file can hold: shown as they are (another object by its type's name).
_DATA = (str, int, float, bool, list, tuple, dict, type(None))


def _not_a_sampler(value: Any) -> str | None:
    """Why ``value``, given from Python, is no ``search_algo``; None for a sampler instance."""
    if isinstance(value, _DATA):
        return None
    samplers = sys.modules.get("optuna.samplers")
    if samplers is not None and isinstance(value, type) and issubclass(value, samplers.BaseSampler):
        name = value.__name__
        return f"got the class {name}; {_INSTANCE} works: search_algo={name}(...)"
    # A Ray Tune searcher can only be given where Ray Tune is imported already.
    search = sys.modules.get("ray.tune.search")
    kinds = (search.Searcher, search.SearchAlgorithm) if search is not None else ()
    cls = value if isinstance(value, type) else type(value)
    if kinds and issubclass(cls, kinds):
        return (
            f"got Ray Tune's {cls.__name__}, a searcher raysearch does not take (it runs "
            f"Tune's OptunaSearch itself, over its strategy's phases); {_INSTANCE} works: "
            f"{_EXAMPLE}, or a strategy's name"
        )
    if samplers is not None and isinstance(value, samplers.BaseSampler):
        return None
    from raysearch.strategies import strategy_names

    given = f"the class {cls.__name__}" if cls is value else f"an object of type {cls.__name__}"
    return f"expected one of {', '.join(strategy_names())} or {_INSTANCE} ({_EXAMPLE}), got {given}"


def parse_sampler_options(value: Any, algo: str, sampler: Any) -> dict[str, Any]:
    """``sampler_options`` for ``algo``, each checked against the sampler's signature."""
    if value is None:
        return {}
    from raysearch.strategies.samplers import SAMPLER_ALGOS, check_sampler_options

    if sampler is not None:
        raise ConfigError(
            _KEY,
            f"the {type(sampler).__name__} given as search_algo runs as it was built; give "
            "its arguments when you build it",
        )
    if algo not in SAMPLER_ALGOS:
        raise ConfigError(
            _KEY,
            f"{algo} is no Optuna sampler strategy (the staged ones keep their fitted "
            f"samplers); sampler_options are for {', '.join(SAMPLER_ALGOS)}",
        )
    return check_sampler_options(algo, value, _KEY)
