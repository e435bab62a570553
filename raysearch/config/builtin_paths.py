"""``builtin:`` paths: names a config may give instead of a file, built when resolved.

Example:
    >>> is_builtin("builtin:magika"), is_builtin("model.onnx")
    (True, False)
    >>> resolve_builtin("builtin:magika").name
    'model.onnx'
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raysearch.errors import canonical_name

__all__ = ["BUILTIN_PREFIX", "BUILTIN_NAMES", "is_builtin", "resolve_builtin"]

BUILTIN_PREFIX = "builtin:"


def _magika_model() -> Path:
    from raysearch.demo import MAGIKA_DIR

    return MAGIKA_DIR / "model.onnx"


def _magika_data(which: int) -> Callable[[], Path]:
    def resolve() -> Path:
        from raysearch.demo import build_demo_data

        return build_demo_data()[which]

    return resolve


_RESOLVERS: dict[str, Callable[[], Path]] = {
    "magika": _magika_model,
    "magika-calib": _magika_data(0),
    "magika-eval": _magika_data(1),
}
#: Every ``builtin:`` name, prefix included, in the order messages list them.
BUILTIN_NAMES = tuple(BUILTIN_PREFIX + name for name in _RESOLVERS)


def is_builtin(value: object) -> bool:
    """Whether ``value`` is a ``builtin:`` path."""
    return isinstance(value, str) and value.startswith(BUILTIN_PREFIX)


def resolve_builtin(name: str) -> Path:
    """The path behind a ``builtin:`` name (any case; KeyError: no such built-in)."""
    name = name[len(BUILTIN_PREFIX) :] if name.startswith(BUILTIN_PREFIX) else name
    known = canonical_name(name, _RESOLVERS)
    if known is None:
        raise KeyError(name)
    return _RESOLVERS[known]()
