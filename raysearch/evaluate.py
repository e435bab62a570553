"""Scoring quantized models: built-in metrics, custom evaluators, the tolerance.

The public face of the evaluate stage. Its parts, one concept each:

- :mod:`raysearch.metrics`: the table of built-in metrics (L1, L2, cos, PSNR, SSIM: name,
  function, direction) and their maths (:func:`compute_metric`),
- ``raysearch._evaluate._run``: running a model over the data and timing it,
- ``raysearch._evaluate._reference``: the float model's outputs (:class:`FloatReference`),
- ``raysearch._evaluate._evaluator``: scores and the tolerance (:class:`Evaluator`),
- this module: loading a custom evaluator by import path (:func:`load_custom_evaluator`), kept
  here so that the one place raysearch imports code by name is easy to audit.

A custom evaluator is ``fn(model_path: str, providers: list) -> float | dict``, given as a
callable or as ``"package.module:function"`` (a module that is not installed is looked up in
the config's folder, then the working directory: :mod:`raysearch.usercode`). A dict names its
main metric by ``metric_key``, else by the key ``"metric"``, else by being its only key; other
numeric keys are recorded as extra metrics. The float model is scored once with the same function.

Example:
    >>> from raysearch.evaluate import Evaluator
    >>> ev = Evaluator("cos", tolerance=0.999)
    >>> ev.higher_is_better, ev.is_candidate(0.9995), ev.is_candidate(0.99)
    (True, True, False)
    >>> top1 = Evaluator("my_pkg.evals:top1", tolerance=0.01,        # doctest: +SKIP
    ...                  tolerance_mode="relative", higher_is_better=True)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from raysearch._evaluate._evaluator import Evaluator, Score
from raysearch._evaluate._reference import FloatReference
from raysearch._evaluate._run import measure_latency, run_model
from raysearch.errors import ConfigError, EvaluatorError, suggest
from raysearch.metrics import (
    BUILTIN_METRICS,
    PSNR_CAP_DB,
    MetricError,
    compute_metric,
    metric_cos,
    metric_l1,
    metric_l2,
    metric_psnr,
    metric_ssim,
)
from raysearch.usercode import import_named

__all__ = [
    "BUILTIN_METRICS",
    "PSNR_CAP_DB",
    "MetricError",
    "EvaluatorError",
    "Score",
    "Evaluator",
    "FloatReference",
    "metric_l1",
    "metric_l2",
    "metric_cos",
    "metric_psnr",
    "metric_ssim",
    "compute_metric",
    "load_custom_evaluator",
    "run_model",
    "measure_latency",
]


def load_custom_evaluator(
    spec: str | Callable[..., Any],
    key: str = "metric",
    search_dirs: Sequence[str | os.PathLike] = (),
) -> Callable[..., Any]:
    """The function named by ``"package.module:function"`` (or ``spec`` itself when callable),
    checked to accept ``(model_path, providers)``. A module Python does not find is imported
    from the first of ``search_dirs`` holding it (:func:`raysearch.usercode.import_named`).

    Raises:
        ConfigError: (at ``key``) the module cannot be imported, has no such function, or the
            function cannot be called with two arguments.
    """
    if callable(spec):
        func, label = spec, getattr(spec, "__qualname__", repr(spec))
    else:
        module_name, _, func_name = str(spec).partition(":")
        if not module_name or not func_name:
            raise ConfigError(key, f"expected 'package.module:function', got {spec!r}")
        try:
            module = import_named(module_name, search_dirs)
        except ModuleNotFoundError as exc:
            looked = ""
            if search_dirs and exc.name == module_name.partition(".")[0]:
                looked = f" (looked in {', '.join(map(str, search_dirs))} too)"
            raise ConfigError(key, f"cannot import module '{module_name}': {exc}{looked}") from None
        except Exception as exc:
            raise ConfigError(
                key, f"importing '{module_name}' failed: {type(exc).__name__}: {exc}"
            ) from None
        func = getattr(module, func_name, None)
        if func is None:
            public = [n for n in dir(module) if not n.startswith("_")]
            raise ConfigError(
                key,
                f"module '{module_name}' has no function '{func_name}'"
                + suggest(func_name, public),
            )
        if not callable(func):
            raise ConfigError(key, f"'{spec}' is not callable")
        label = str(spec)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return func  # a builtin without a signature: the call decides
    try:
        signature.bind("model.onnx", ["CPUExecutionProvider"])
    except TypeError:
        raise ConfigError(
            key,
            f"'{label}' must accept (model_path, providers); it accepts "
            f"({', '.join(signature.parameters)})",
        ) from None
    return func
