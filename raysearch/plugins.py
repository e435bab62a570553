"""Modules that registered a backend, technique or strategy from outside raysearch.

A plugin registers itself when its module is imported (``@register_backend``,
``register_technique``, ``@register_strategy``). The driver imported it, but a trial runs in
a Ray actor, often on another node, that has not: the search ships the names recorded here to
every actor, which imports them before its first trial (:func:`import_plugins`). The module
must be importable there, as any code a config names is: installed, on the ``PYTHONPATH`` of
Ray's workers, or beside the config (or in the working directory), whence the search ships it
to every worker (:mod:`raysearch.usercode`).

Example:
    >>> note_plugin("raysearch.quantize.backends.ort")  # raysearch's own modules: not recorded
    >>> "raysearch.quantize.backends.ort" in plugin_modules()
    False
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

from raysearch.usercode import import_named

__all__ = ["note_plugin", "plugin_modules", "import_plugins"]

_logger = logging.getLogger(__name__)
_MODULES: dict[str, None] = {}


def note_plugin(module: str) -> None:
    """Record that ``module`` registered something (raysearch's own modules excepted, and
    ``__main__``, which no other process can import)."""
    if module == "raysearch" or module.startswith("raysearch.") or module == "__main__":
        return
    _MODULES[module] = None


def plugin_modules() -> tuple[str, ...]:
    """The recorded plugin modules, in the order they registered something."""
    return tuple(_MODULES)


def import_plugins(
    modules: Iterable[str],
    *,
    strict: bool = True,
    search_dirs: Sequence[str | os.PathLike] = (),
) -> None:
    """Import ``modules`` (registering their plugins in this process); one Python does not find
    from the first of ``search_dirs`` holding it (:func:`raysearch.usercode.import_named`).
    With ``strict=False`` (an actor importing what the driver recorded) a module that cannot
    be imported here is logged and skipped: a trial that needs its plugin then fails with one
    line naming the unknown backend or setting, and every other trial runs."""
    for module in modules:
        try:
            import_named(module, search_dirs)
        except ImportError as exc:
            if strict:
                raise
            _logger.warning("plugin module %s cannot be imported here: %s", module, exc)
            continue
        _logger.debug("plugin module %s imported", module)
