"""Loading a custom evaluator by import path: the one place raysearch imports code by name for
scoring, kept alone so that it is easy to audit (the import itself is
:func:`raysearch.usercode.import_named`)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from raysearch.errors import ConfigError, suggest
from raysearch.usercode import import_named

__all__ = ["load_custom_evaluator"]


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
