"""The ``loggers`` key: Ray Tune's MLflow and W&B logger callbacks, as a list or a mapping to
their settings, each checked against the callback's signature (and ``wandb.init``'s) and a
missing package refused naming the extra. Ray is imported only when the key is given.

Example:
    >>> parse_loggers(None)
    ()
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import Mapping
from typing import Any

from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.signatures import wrong_value

__all__ = ["LOGGERS", "MLFLOW_EXPERIMENT", "parse_loggers", "logger_parameters"]

_KEY = "loggers"

#: Each logger: (the module of Ray's callback, the callback's class, the package it needs).
LOGGERS: dict[str, tuple[str, str, str]] = {
    "mlflow": ("ray.air.integrations.mlflow", "MLflowLoggerCallback", "mlflow"),
    "wandb": ("ray.air.integrations.wandb", "WandbLoggerCallback", "wandb"),
}
_ALIASES = {"weights_and_biases": "wandb", "w&b": "wandb"}
#: MLflow's experiment when nothing names one: Ray's callback logs nothing without one.
MLFLOW_EXPERIMENT = "raysearch"


def logger_parameters(name: str) -> dict[str, Any]:
    """The settings logger ``name`` takes and their types (its callback's, and ``wandb.init``'s)."""
    import importlib

    module, cls, package = LOGGERS[name]
    callback = getattr(importlib.import_module(module), cls)
    params, rest = _keywords(callback.__init__)
    if rest and name == "wandb":
        import wandb

        params = {**_keywords(wandb.init)[0], **params}
    return params


def _keywords(function: Any) -> tuple[dict[str, Any], bool]:
    """The keyword parameters of ``function`` with their types, and whether it has ``**kwargs``."""
    from raysearch.signatures import parameter_types

    params = inspect.signature(function).parameters.values()
    types = parameter_types(function)
    names = {
        p.name: types.get(p.name, Any)
        for p in params
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def parse_loggers(value: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``loggers``: ``(name, settings)`` for each logger, in order (ConfigError otherwise)."""
    if value is None:
        return ()
    if isinstance(value, list):
        entries = [(f"{_KEY}[{i}]", name, {}) for i, name in enumerate(value)]
    elif isinstance(value, Mapping):
        entries = [(f"{_KEY}.{name}", name, settings) for name, settings in value.items()]
    else:
        raise ConfigError(
            _KEY, f"expected a list of loggers or a mapping of each to its settings, got {value!r}"
        )
    out: list[tuple[str, dict[str, Any]]] = []
    for path, raw_name, settings in entries:
        name = canonical_name(raw_name, LOGGERS, _ALIASES)
        if name is None:
            raise ConfigError(
                path,
                f"unknown logger {raw_name!r}; expected one of {', '.join(LOGGERS)}"
                + suggest(str(raw_name), LOGGERS),
            )
        if name in (n for n, _ in out):
            raise ConfigError(path, f"{name} is named twice")
        package = LOGGERS[name][2]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(
                path,
                f"{name} needs the {package} package: pip install 'raysearch[{name}]'",
            )
        settings = {} if settings is None else settings
        if not isinstance(settings, Mapping):
            raise ConfigError(path, f"expected a mapping of {name}'s settings, got {settings!r}")
        known = logger_parameters(name)
        for key, setting in settings.items():
            if key not in known:
                raise ConfigError(
                    f"{path}.{key}",
                    f"{name} takes no setting {key!r}" + suggest(str(key), sorted(known)),
                )
            wrong = wrong_value(setting, known[key])
            if wrong is not None:
                raise ConfigError(f"{path}.{key}", f"{name}'s {key} takes {wrong}")
        out.append((name, _with_defaults(name, dict(settings))))
    return tuple(out)


def _with_defaults(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with MLflow's experiment, which Ray's callback cannot do without."""
    if name == "mlflow" and settings.get("experiment_name") is None:
        if not (os.environ.get("MLFLOW_EXPERIMENT_NAME") or os.environ.get("MLFLOW_EXPERIMENT_ID")):
            settings["experiment_name"] = MLFLOW_EXPERIMENT
    return settings
