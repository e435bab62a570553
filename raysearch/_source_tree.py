"""raysearch run from a source tree without being installed (a checkout or an unpacked sdist
on ``sys.path``): ``raysearch.configs`` is the tree's ``configs/`` folder.

An install maps that package onto ``configs/`` (pyproject's ``package-dir``); a source tree
has no ``raysearch/configs/``, where the predefined spaces would not be found without this.

Example:
    >>> import raysearch, importlib.resources
    >>> (importlib.resources.files("raysearch.configs") / "A8W8_SEARCH.yaml").is_file()
    True
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["use_source_tree_configs"]

_NAME = "raysearch.configs"


def use_source_tree_configs(package: Path) -> bool:
    """Make ``raysearch.configs`` the ``configs/`` beside ``package`` if none is installed."""
    folder = package.parent / "configs"
    init = folder / "__init__.py"
    if _NAME in sys.modules or (package / "configs").is_dir() or not init.is_file():
        return False
    spec = importlib.util.spec_from_file_location(
        _NAME, init, submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    # What the import system does for a submodule it loads: the parent's attribute.
    parent = sys.modules.get(_NAME.rpartition(".")[0])
    if parent is not None:
        parent.configs = module  # type: ignore[attr-defined]
    return True
