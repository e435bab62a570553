"""Python objects a config may hold where a file would be named, as Quark's API takes them: an
``onnx.ModelProto`` (saved once, named by its content) and ``CalibrationDataReader`` objects
(read once, into one array per model input).

Example:
    >>> plain_copy({"a": [1, {"b": 2}], "reader": object})["a"]
    [1, {'b': 2}]
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysearch.errors import ConfigError, InputError

__all__ = [
    "is_model_object",
    "is_reader",
    "model_object_path",
    "plain_copy",
    "read_reader",
    "written_config",
]

#: Where model objects are saved (``$TMPDIR/raysearch-<uid>/raysearch-models/<sha256>.onnx``).
MODEL_FOLDER = "raysearch-models"


def plain_copy(value: Any) -> Any:
    """``value`` with its dicts and lists copied, other objects (a reader, a model) as they are."""
    if isinstance(value, Mapping):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    return value


def is_model_object(value: Any) -> bool:
    """Whether ``value`` is an ``onnx.ModelProto``."""
    import onnx

    return isinstance(value, onnx.ModelProto)


def model_object_path(model: Any, folder: str | os.PathLike | None = None) -> Path:
    """The file holding ``model``, saved once under ``folder`` named by its content's SHA-256."""
    try:
        data = model.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise ConfigError(
            "model",
            f"the ModelProto cannot be serialized ({exc}); save it with external data "
            "(onnx.save_model(..., save_as_external_data=True)) and give its path",
        ) from None
    digest = hashlib.sha256(data).hexdigest()[:32]
    try:
        if folder:
            target_folder = Path(folder)
            target_folder.mkdir(parents=True, exist_ok=True)
        else:  # this user's private folder: another user's or a shared one is refused
            from raysearch.quantize.tempdirs import private_dir

            target_folder = private_dir(MODEL_FOLDER)
    except (OSError, InputError) as exc:  # InputError: a folder that is not this user's
        raise ConfigError("model", f"cannot save the ModelProto: {exc}") from None
    target = target_folder / f"{digest}.onnx"
    if target.is_file() and target.read_bytes() == data:  # used only when it is this model
        return target
    try:
        # Written beside, then renamed: a concurrent search never reads half a file.
        fd, partial = tempfile.mkstemp(dir=target_folder, suffix=".partial")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(partial, target)
    except OSError as exc:
        raise ConfigError(
            "model", f"cannot save the ModelProto to {target}: {exc.strerror or exc}"
        ) from None
    return target


def is_reader(value: Any) -> bool:
    """Whether ``value`` reads like ONNX Runtime's ``CalibrationDataReader`` (``get_next``)."""
    return callable(getattr(value, "get_next", None))


def read_reader(reader: Any, model: Path, key: str) -> dict[str, Any]:
    """Every feed of ``reader`` as one array per input of ``model`` (ConfigError at ``key``)."""
    from raysearch.data import DataSource

    try:
        return dict(DataSource.load(reader, model, label=key).arrays)
    except InputError as exc:
        # The ConfigError names the key itself, the data error its source.
        message = str(exc).partition(": ")[2] or str(exc)
        raise ConfigError(key, f"{type(reader).__name__}: {message}") from None
    except Exception as exc:  # the user's reader raised
        raise ConfigError(
            key, f"{type(reader).__name__}.get_next() raised {type(exc).__name__}: {exc}"
        ) from None


def written_config(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``raw`` as a config file can hold it (what YAML cannot write in words), and those keys.

    Example:
        >>> written_config({"metric": "cos", "calibration_data": object()})
        ({'metric': 'cos', 'calibration_data': '<python object: object>'}, ['calibration_data'])
    """
    import yaml

    from raysearch.usercode import qualified_name

    out = plain_copy(dict(raw))
    objects = []
    for key, value in list(out.items()):
        try:
            yaml.safe_dump(value)
        except yaml.YAMLError:
            objects.append(key)
            if callable(value) and not is_reader(value):
                out[key] = f"<python function: {qualified_name(value)}>"
            else:
                out[key] = f"<python object: {type(value).__name__}>"
    return out, objects
