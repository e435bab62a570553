"""Paths in a config: inputs relative to the config's folder (``builtin:`` names included; the
model checked from its header), ``output_dir`` relative to the working directory.

Example:
    >>> input_path({"model": "builtin:magika"}, "model", True, Path("."), True).name
    'model.onnx'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysearch.config.builtin_paths import BUILTIN_NAMES, is_builtin, resolve_builtin
from raysearch.errors import ConfigError
from raysearch.modelfile import header_problem
from raysearch.modelfolder import find_model_file

__all__ = ["input_path", "model_path", "output_dir"]


def input_path(
    data: Mapping[str, Any], key: str, required: bool, base: Path, check_paths: bool
) -> Any:
    """The input at ``key``: a checked path, a ``builtin:`` resolved, a Python object, or None."""
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(key, "is required")
        return None
    if not isinstance(value, (str, os.PathLike)):
        return value  # a CalibrationDataReader object given from Python
    if is_builtin(value):
        try:
            return resolve_builtin(value)
        except KeyError:
            raise ConfigError(
                key, f"unknown built-in {value!r}; known: {', '.join(BUILTIN_NAMES)}"
            ) from None
    p = Path(os.path.expanduser(str(value)))
    p = p if p.is_absolute() else base / p
    if check_paths and not p.exists():
        raise ConfigError(key, f"file not found: {p}")
    return p


def model_path(data: Mapping[str, Any], base: Path, check_paths: bool) -> Path:
    """The ``model`` key: an ONNX file, a genai or Optimum folder, or an ``onnx.ModelProto``."""
    from raysearch.config._objects import is_model_object, model_object_path

    if is_model_object(data.get("model")):
        return model_object_path(data["model"])
    model = input_path(data, "model", True, base, check_paths)
    if not isinstance(model, Path):
        raise ConfigError(
            "model",
            f"expected a path to an .onnx file or an onnx.ModelProto, got {type(model).__name__}",
        )
    if model.is_dir():  # an onnxruntime-genai or Optimum folder: its model file
        try:
            model = find_model_file(model)
        except ValueError as exc:
            raise ConfigError("model", str(exc)) from None
    if check_paths:
        try:
            problem = header_problem(model) if model.stat().st_size else "empty"
        except OSError as exc:
            raise ConfigError("model", f"cannot read {model}: {exc.strerror or exc}") from None
        if problem == "empty":
            raise ConfigError("model", f"{model} is empty")
        if problem:
            raise ConfigError("model", f"{model} is not an ONNX model (cannot parse it: {problem})")
    return model


def output_dir(data: Mapping[str, Any], check_paths: bool) -> Path:
    """The ``output_dir`` key, absolute."""
    out = data.get("output_dir", "raysearch_output")
    if not isinstance(out, (str, os.PathLike)):
        raise ConfigError("output_dir", f"expected a path, got {out!r}")
    out_path = Path(os.path.expanduser(str(out)))
    # Outputs go where the user runs raysearch, not next to a (possibly installed) config.
    out_path = out_path if out_path.is_absolute() else Path.cwd() / out_path
    if check_paths and out_path.exists() and not out_path.is_dir():
        raise ConfigError("output_dir", f"exists and is not a directory: {out_path}")
    return out_path
