"""The output writers' libraries imported without the heavy optional packages they try for
features raysearch does not use (PyTorch for tensorboardX, scikit-learn and matplotlib for
Optuna): a meta-path finder refuses those imports to those importers, for the whole process,
so only the ``raysearch`` command installs it.

Example:
    >>> skip_unused_optional_imports()
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["skip_unused_optional_imports"]

#: The package refused, and the package whose modules it is refused to.
_REFUSED: dict[str, str] = {
    "torch": "tensorboardX",
    "sklearn": "optuna.importance",
    # Optuna's matplotlib figures: the report draws Optuna's plotly ones, and the command's
    # plots/ are drawn in a process of their own (raysearch.outputs.PlotProcess).
    "matplotlib": "optuna.visualization",
}


class _RefuseUnusedOptional(importlib.abc.MetaPathFinder):
    """Raises ``ModuleNotFoundError`` for a refused package imported by its refused importer."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> Any:
        importer_package = _REFUSED.get(fullname.partition(".")[0])
        if importer_package is None:
            return None
        importer = _importing_module()
        if importer == importer_package or importer.startswith(importer_package + "."):
            raise ModuleNotFoundError(
                f"raysearch skips {fullname} for {importer} (not used)", name=fullname
            )
        return None


def _importing_module() -> str:
    """``__name__`` of the module running the import being resolved."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != __name__ and not name.startswith("importlib"):
            return name
        frame = frame.f_back
    return ""


def skip_unused_optional_imports() -> None:
    """Install the finder (first on ``sys.meta_path``), once per process."""
    if not any(isinstance(f, _RefuseUnusedOptional) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefuseUnusedOptional())
