"""Code a config names: its custom evaluator (``metric: "module:function"``) and ``plugins``.

A module is imported as Python imports it (installed, or on ``PYTHONPATH``); a top-level
module or package that Python does not find is looked up in the config's folder, then in the
working directory (the *search folders*), as a script finds the modules beside it. Only the
module named comes from there: no folder is put on ``sys.path``, so nothing else in it can
shadow an installed module, in the driver or in the workers.

A function given as the evaluator from Python is named by :func:`qualified_name`
(``module:qualname``) wherever the search writes its name.

Other machines of a Ray cluster have neither folder, so :func:`local_modules` names the file
(``evaluators.py``) or package folder of each module that lies directly in a search folder,
and the search ships them to every Ray worker as its job's ``runtime_env`` ``py_modules``
(:func:`raysearch.search.runtime.cluster.start_ray`): there they import by the same name, on
a local Ray as on a cluster.

Example:
    >>> import_named("json").__name__
    'json'
    >>> local_modules(["json"], ["."])  # installed: nothing to ship
    []
    >>> qualified_name(import_named("json").dumps)
    'json:dumps'
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["import_named", "local_modules", "qualified_name"]

_logger = logging.getLogger(__name__)


def import_named(name: str, search_dirs: Sequence[str | os.PathLike] = ()) -> ModuleType:
    """Import module ``name`` (dotted); when Python finds no top-level module of that name,
    from the first of ``search_dirs`` that holds it (a ``.py`` file or a package folder).

    Raises:
        ImportError: as :func:`importlib.import_module` (``ModuleNotFoundError`` when no
            search folder holds it either).
    """
    top = name.partition(".")[0]
    if search_dirs and top and top not in sys.modules and importlib.util.find_spec(top) is None:
        folders = [os.fspath(folder) for folder in search_dirs]
        spec = importlib.machinery.PathFinder.find_spec(top, folders)
        if spec is not None:
            _execute(top, spec)
            _logger.debug("module %s imported from %s", top, spec.origin or folders)
    return importlib.import_module(name)


def _execute(name: str, spec: importlib.machinery.ModuleSpec) -> None:
    """Run the top-level module of ``spec`` as ``import`` does, registered as ``name``."""
    module = importlib.util.module_from_spec(spec)
    if spec.submodule_search_locations is not None:
        # A namespace package (a folder without __init__.py) recomputes its path from
        # sys.path, which does not hold the search folder: fix it to the folders found.
        module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _locations(module: ModuleType) -> list[Path]:
    """The package folders of ``module``, or its file."""
    folders = getattr(module, "__path__", None)
    if folders is not None:
        return [Path(folder) for folder in folders]
    file = getattr(module, "__file__", None)
    return [Path(file)] if file else []


def local_modules(names: Iterable[str], search_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The file or package folder of each imported module of ``names`` (by its top-level
    module) that lies directly in one of ``search_dirs``: what a worker on another machine
    lacks. Modules not imported yet, and those installed elsewhere, are not listed."""
    folders = {os.path.realpath(folder) for folder in search_dirs}
    found: dict[Path, None] = {}
    for name in names:
        module = sys.modules.get(name.partition(".")[0])
        for location in _locations(module) if module is not None else []:
            if os.path.realpath(location.parent) not in folders:
                continue
            if location.is_dir() or location.suffix == ".py":
                found[location.absolute()] = None
            else:  # a compiled module: Ray ships only sources and folders
                _logger.warning(
                    "module %s (%s) cannot be shipped to Ray's workers: only a .py file or a "
                    "package folder can; install it on every node instead",
                    name,
                    location,
                )
    return list(found)


def qualified_name(func: object) -> str:
    """``module:qualname`` of a function (``my_eval:top1``, ``__main__:<lambda>``,
    ``tests.x:test.<locals>.score``): the name a function given from Python goes by in a
    search's outputs; an object without a ``__qualname__`` (a callable instance) is named by
    its class."""
    named = func if hasattr(func, "__qualname__") else type(func)
    module = getattr(named, "__module__", None) or "?"
    return f"{module}:{getattr(named, '__qualname__', repr(named))}"
