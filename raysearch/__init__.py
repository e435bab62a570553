"""raysearch: scalable search for the best post-training quantization of ONNX models.

The public API is what :data:`__all__` lists; the plugin API is :mod:`raysearch.plugins`.
Everything else is internal.

Example:
    >>> from raysearch import AutoSearch                       # doctest: +SKIP
    >>> result = AutoSearch("configs/quickstart.yaml").run()   # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path as _Path
from typing import TYPE_CHECKING
from typing import Any as _Any
from typing import Protocol as _Protocol

# The built-in backends' settings catalogues (pure data) register themselves here, so every
# search space is checked against them without the space package importing a backend.
import raysearch.quantize.backends.nncf.options  # noqa: F401  (the ``nncf`` catalogue; no NNCF import)
import raysearch.quantize.backends.nncf_weight_only.options  # noqa: F401  (no NNCF import)
import raysearch.quantize.backends.ort.options  # noqa: F401  (registers the ``ort`` catalogue)
import raysearch.quantize.backends.weight_only.options  # noqa: F401  (``weight_only``'s)
from raysearch._source_tree import use_source_tree_configs as _use_source_tree_configs
from raysearch.config import SearchConfig, load_config
from raysearch.errors import ConfigError, InputError
from raysearch.quantize.registry import register_backend
from raysearch.quantize.technique import register_technique
from raysearch.quantize.technique import registered_techniques as _techniques
from raysearch.space import SearchSpace
from raysearch.strategies import register_strategy

_techniques()  # the built-in techniques register their settings in every catalogue
# From a source tree (not installed), the predefined spaces are its configs/ folder.
_use_source_tree_configs(_Path(__file__).resolve().parent)

#: The one place of raysearch's version: pyproject.toml reads it (``tool.setuptools.dynamic``).
__version__ = "0.1.0"

#: The public API (see the module docstring); ``tests/test_public_api.py`` checks it.
__all__ = [
    "AutoSearch",
    "SearchResult",
    "SearchConfig",
    "SearchSpace",
    "ConfigError",
    "InputError",
    "load_config",
    "register_backend",
    "register_technique",
    "register_strategy",
    "CustomEvaluator",
]


class CustomEvaluator(_Protocol):
    """The signature of a custom evaluator: the config's ``metric: "module:function"``, or the
    function itself given as ``metric`` from Python (README, "Custom evaluators").

    Args:
        model_path: the quantized model to score (the float model's path once, first).
        providers: the ONNX Runtime execution providers of the trial, in order.
        fraction: only when the function takes it: the share of the evaluation rows to
            score (evaluation on growing subsets calls it with each rung's share, 1.0 last).

    Returns:
        The metric (a float), or a mapping of named metrics (the config's ``metric_key``
        picks one).

    Example:
        >>> def mean_output(model_path: str, providers: list[str]) -> float:
        ...     return 1.0
        >>> evaluator: CustomEvaluator = mean_output
    """

    def __call__(self, model_path: str, providers: list[str]) -> float | dict[str, float]: ...


if TYPE_CHECKING:
    from raysearch.search import AutoSearch, SearchResult


def __getattr__(name: str) -> _Any:
    # Ray is imported only when a search is actually built, keeping `import raysearch` and the
    # config checks fast.
    if name in ("AutoSearch", "SearchResult"):
        from raysearch import search

        return getattr(search, name)
    raise AttributeError(f"module 'raysearch' has no attribute {name!r}")
