"""The ``optuna_storage`` key: an Optuna RDB storage URL the search writes its study into as
each trial ends (opened when the search starts; here only its form is checked).

Example:
    >>> parse_optuna_storage("sqlite:///study.db"), parse_optuna_storage(None)
    ('sqlite:///study.db', None)
"""

from __future__ import annotations

import importlib.util
from typing import Any

from raysearch.errors import ConfigError

__all__ = ["parse_optuna_storage"]

_KEY = "optuna_storage"


def parse_optuna_storage(value: Any) -> str | None:
    """``optuna_storage``: the URL or None (refused: no ``scheme://``, or no SQLAlchemy)."""
    if value is None:
        return None
    if not isinstance(value, str) or "://" not in value:
        raise ConfigError(
            _KEY, f"expected an Optuna storage URL such as sqlite:///study.db, got {value!r}"
        )
    if importlib.util.find_spec("sqlalchemy") is None:
        raise ConfigError(_KEY, "Optuna's RDB storage needs SQLAlchemy: pip install sqlalchemy")
    return value
