"""Loading a custom evaluator by import path (kept alone, to be easy to audit), and a function
given from Python, pickled for the trials: its module's code by value unless the module is
installed, since a Ray worker cannot import a test module, the user's project or ``__main__``.
A function that cannot be pickled is refused when the config is read.

Example:
    >>> import threading
    >>> lock = threading.Lock()
    >>> load_custom_evaluator(lambda path, providers: lock.locked())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    raysearch.errors.ConfigError: metric: '...<lambda>' cannot be sent to the trials (TypeError: cannot pickle '_thread.lock' object); ...
"""  # noqa: E501

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from raysearch.errors import ConfigError, suggest
from raysearch.usercode import import_named, qualified_name

__all__ = ["load_custom_evaluator", "pickle_for_trials", "takes_providers"]


def load_custom_evaluator(
    spec: str | Callable[..., Any],
    key: str = "metric",
    search_dirs: Sequence[str | os.PathLike] = (),
) -> Callable[..., Any]:
    """The function ``"package.module:function"`` names (or ``spec`` if callable), checked to take
    ``(model_path, providers)`` or Quark's ``(onnx_path, **args)``.
    """
    if callable(spec):
        func, label = spec, qualified_name(spec)
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
    _check_signature(func, label, key)
    if callable(spec):
        _check_picklable(func, label, key)
    return func


def takes_providers(func: Callable[..., Any]) -> bool:
    """Whether ``func`` takes ``(model_path, providers)``, not only Quark's ``(onnx_path,
    **args)`` form.

    Example:
        >>> takes_providers(lambda path, providers: 1.0), takes_providers(lambda path, **a: 1.0)
        (True, False)
        >>> takes_providers(lambda onnx_path, **args: 1.0), takes_providers(len)
        (False, True)
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return True  # a builtin without a signature: the call decides
    try:
        signature.bind("model.onnx", ["CPUExecutionProvider"])
        return True
    except TypeError:
        pass
    try:
        signature.bind("model.onnx")
    except TypeError:
        return True
    return not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())


def _check_signature(func: Callable[..., Any], label: str, key: str) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call decides
    if not takes_providers(func):
        return
    try:
        signature.bind("model.onnx", ["CPUExecutionProvider"])
    except TypeError:
        raise ConfigError(
            key,
            f"'{label}' must accept (model_path, providers), or (onnx_path, **args) as Quark's "
            f"search_evaluator does; it accepts ({', '.join(signature.parameters)})",
        ) from None


def _check_picklable(func: Callable[..., Any], label: str, key: str) -> None:
    try:
        pickle_for_trials(func)
    except Exception as exc:  # whatever pickling the function or what it holds raises
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            key,
            f"'{label}' cannot be sent to the trials ({type(exc).__name__}: {reason}); "
            "define it at module level and create what it holds (a lock, an open file, a "
            "session) inside it, or name it as 'module:function'",
        ) from None


def _installed(module: ModuleType) -> bool:
    """Whether ``module`` is built in, or a file of the standard library or site-packages."""
    file = getattr(module, "__file__", None)
    if not file:
        return module.__name__ != "__main__"
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = os.path.realpath(file)
    return any(real.startswith(root + os.sep) for root in roots)


def pickle_for_trials(func: Callable[..., Any]) -> bytes:
    """``func`` pickled by Ray's cloudpickle, its module by value unless installed."""
    from ray import cloudpickle

    module = sys.modules.get(getattr(func, "__module__", None) or "")
    by_value = (
        module is not None
        and module.__name__ != "__main__"  # cloudpickle's by value already
        and not _installed(module)
        and module.__name__ not in cloudpickle.list_registry_pickle_by_value()
    )
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(func)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
