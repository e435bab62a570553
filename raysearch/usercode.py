"""Code a config names: its custom evaluator (``metric: "module:function"``) and ``plugins``.

The registries record each module from outside raysearch that registered something
(:func:`note_plugin`); every trial actor imports them first (:func:`import_plugins`). A
top-level module Python does not find is looked up in the config's folder, then the working
directory, without touching ``sys.path``; a search joining a cluster ships those folders as
its job's ``py_modules`` (:func:`code_folders`, :func:`check_shippable`).

Example:
    >>> import_named("json").__name__
    'json'
    >>> local_modules(["json"], ["."])  # installed: nothing to ship
    []
    >>> qualified_name(import_named("json").dumps)
    'json:dumps'
    >>> note_plugin("raysearch.quantize.backends.ort")  # raysearch's own modules: not recorded
    >>> "raysearch.quantize.backends.ort" in plugin_modules()
    False
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

__all__ = [
    "import_named",
    "note_plugin",
    "plugin_modules",
    "import_plugins",
    "loaded_modules",
    "local_modules",
    "code_folders",
    "check_shippable",
    "shipped_bytes",
    "where_code_lives",
    "qualified_name",
    "SHIP_LIMIT_BYTES",
]

_logger = logging.getLogger(__name__)
#: The modules that registered a plugin, in order (see :func:`note_plugin`).
_MODULES: dict[str, None] = {}

#: The most a folder of code may hold to be shipped to the other nodes of a Ray cluster.
SHIP_LIMIT_BYTES = 100 * 2**20
#: The prefix of the folder Ray unpacks a shipped package into (Ray's ``RAY_PKG_PREFIX``).
RAY_PKG_PREFIX = "_ray_pkg_"


def import_named(name: str, search_dirs: Sequence[str | os.PathLike] = ()) -> ModuleType:
    """Import module ``name``; a top-level module Python does not find, from ``search_dirs``."""
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
    """The file or package folder of each module of ``names`` lying in ``search_dirs``."""
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


def code_folders(names: Iterable[str], search_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The search folders holding a module :func:`local_modules` lists (shipped to the nodes)."""
    return list(dict.fromkeys(location.parent for location in local_modules(names, search_dirs)))


def shipped_bytes(folder: str | os.PathLike, excluded: Iterable[str | os.PathLike] = ()) -> int:
    """Bytes Ray uploads when it ships ``folder`` as ``py_modules`` (``excluded`` left out),
    counted by Ray's own walk (``.gitignore`` and ``.rayignore`` apply).
    """
    from ray._private.runtime_env import packaging

    root = Path(folder).absolute()
    patterns = [
        "/" + path.relative_to(root).as_posix()
        for path in (Path(p).absolute() for p in excluded)
        if path.is_relative_to(root) and path != root
    ]
    total = 0

    def count(path: Path) -> None:
        nonlocal total
        if path.is_file():
            total += path.stat().st_size

    packaging._dir_travel(
        root,
        [packaging._get_excludes(root, patterns)],
        count,
        include_gitignore=os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1",
        logger=_logger,
    )
    return total


def check_shippable(
    folder: str | os.PathLike,
    excluded: Iterable[str | os.PathLike] = (),
    *,
    limit: int = SHIP_LIMIT_BYTES,
    modules: Sequence[str] = (),
) -> None:
    """Refuse a code folder over ``limit`` bytes to ship to the cluster (ConfigError at
    ``metric``).
    """
    from raysearch.errors import ConfigError

    folder = Path(folder).absolute()
    size = shipped_bytes(folder, excluded)
    if size <= limit:
        return
    names = ", ".join(modules) or "the code"
    raise ConfigError(
        "metric",
        f"{folder} holds {size / 1e6:.0f} MB besides the model and data, more than the "
        f"{limit / 1e6:.0f} MB raysearch ships to the other nodes of a Ray cluster with "
        f"{names} (a module runs in its folder, beside the files it reads): move {names} and "
        "the files it reads into a folder of their own, or install it on every node",
    )


def where_code_lives(search_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The search folders on this machine: each that exists, else Ray's unpacked copy.

    Example:
        >>> where_code_lives(["/no/such/folder"])
        []
    """
    found: list[Path] = []
    for folder in map(Path, search_dirs):
        if folder.is_dir():
            found.append(folder)
            continue
        for entry in sys.path:
            if Path(entry).name.startswith(RAY_PKG_PREFIX) and (Path(entry) / folder.name).is_dir():
                found.append(Path(entry) / folder.name)
    return found


def qualified_name(func: object) -> str:
    """``module:qualname`` of a function (a callable instance: its class's)."""
    named = func if hasattr(func, "__qualname__") else type(func)
    module = getattr(named, "__module__", None) or "?"
    return f"{module}:{getattr(named, '__qualname__', repr(named))}"


def note_plugin(module: str) -> None:
    """Record that ``module`` registered something (not raysearch's own, nor ``__main__``)."""
    if module == "raysearch" or module.startswith("raysearch.") or module == "__main__":
        return
    _MODULES[module] = None


def plugin_modules() -> tuple[str, ...]:
    """The recorded plugin modules, in the order they registered something."""
    return tuple(_MODULES)


def loaded_modules(named: Iterable[str]) -> list[str]:
    """The modules imported in this process that are one of ``named`` or below one (a
    package's submodules, however late imported), sorted: a package before its modules.

    Example:
        >>> loaded_modules(["json"])[:2]
        ['json', 'json.decoder']
    """
    prefixes = tuple(named)
    below = tuple(f"{name}." for name in prefixes)
    return sorted(m for m in list(sys.modules) if m in prefixes or m.startswith(below))


def import_plugins(
    modules: Iterable[str],
    *,
    strict: bool = True,
    search_dirs: Sequence[str | os.PathLike] = (),
) -> None:
    """Import ``modules``, from ``search_dirs`` where Python does not find one; with
    ``strict=False`` a failure is logged and skipped.
    """
    for module in modules:
        try:
            import_named(module, search_dirs)
        except ImportError as exc:
            if strict:
                raise
            _logger.warning("plugin module %s cannot be imported here: %s", module, exc)
            continue
        _logger.debug("plugin module %s imported", module)
