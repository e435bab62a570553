"""Config files: reading YAML safely, and ``key.path=value`` overrides from the command line.

Example:
    >>> apply_overrides({"stop": {}}, ["stop.iteration_limit=20", "seed=3"])
    {'stop': {'iteration_limit': 20}, 'seed': 3}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from raysearch.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` reading ``1e-3`` as a number (YAML 1.2), not a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

__all__ = ["apply_overrides", "read_yaml"]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                item, "an override is written key=value, e.g. stop.iteration_limit=20"
            )
        try:
            value = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as exc:
            raise ConfigError(key, f"cannot read value {text!r}: {exc}") from None
        target = data
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"'{part}' is not a mapping")
            target = nxt
        target[parts[-1]] = value
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a config file with ``yaml.safe_load``, one-line errors for what cannot be read."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("", f"config file not found: {path}")
    if path.is_dir():
        raise ConfigError("", f"expected a YAML file, got a directory: {path}")
    try:
        with path.open(encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError("", f"{path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{path}: not a text file") from None
    if data is None:
        raise ConfigError("", f"{path}: the config file is empty")
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: expected a mapping of keys, got {type(data).__name__}")
    return data
