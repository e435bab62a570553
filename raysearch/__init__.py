"""raysearch: scalable search for the best post-training quantization of ONNX models.

Example:
    >>> from raysearch import AutoSearch                       # doctest: +SKIP
    >>> result = AutoSearch("configs/quickstart.yaml").run()   # doctest: +SKIP
    >>> result.best_params, result.best_metric                 # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

# The built-in backends' settings catalogues (pure data) register themselves here, so every
# search space is checked against them without the space package importing a backend.
import raysearch.quantize.backends.nncf.options  # noqa: F401  (the ``nncf`` catalogue; no NNCF import)
import raysearch.quantize.backends.ort.options  # noqa: F401  (registers the ``ort`` catalogue)
import raysearch.quantize.backends.weight_only.options  # noqa: F401  (``weight_only``'s)
from raysearch._source_tree import use_source_tree_configs
from raysearch.config import SearchConfig, load_config
from raysearch.errors import ConfigError, InputError
from raysearch.quantize.technique import registered_techniques as _techniques
from raysearch.space import SearchSpace

_techniques()  # the built-in techniques register their settings in every catalogue
# From a source tree (not installed), the predefined spaces are its configs/ folder.
use_source_tree_configs(Path(__file__).resolve().parent)

#: The one place of raysearch's version: pyproject.toml reads it (``tool.setuptools.dynamic``).
__version__ = "0.1.0"

__all__ = [
    "AutoSearch",
    "SearchResult",
    "SearchConfig",
    "SearchSpace",
    "ConfigError",
    "InputError",
    "load_config",
]

if TYPE_CHECKING:
    from raysearch.search import AutoSearch, SearchResult


def __getattr__(name: str) -> Any:
    # Ray is imported only when a search is actually built, keeping `import raysearch` and the
    # config checks fast.
    if name in ("AutoSearch", "SearchResult"):
        from raysearch import search

        return getattr(search, name)
    raise AttributeError(f"module 'raysearch' has no attribute {name!r}")
