"""Checking data against the model's inputs: names, dtypes, shapes, sample counts, batching.

Example:
    >>> spec = ModelInput("x", np.dtype("float32"), ("N", 4))
    >>> check_arrays({"x": np.zeros((3, 4), np.float32)}, [spec], "data")["x"].shape
    (3, 4)
    >>> check_arrays({"x": np.zeros((3, 5), np.float32)}, [spec], "data")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    raysearch.errors.DataError: data: input 'x' has shape (3, 5) (the whole array, ...), ... [N, 4]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raysearch.data._inputs import ModelInput
from raysearch.errors import DataError, suggest

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "PICKLE_MESSAGE",
    "declared",
    "feed_batch",
    "check_arrays",
    "as_array",
]

# The logger of the public module: what users filter on did not move.
_logger = logging.getLogger("raysearch.data._data")

#: Samples per batch when the model has a dynamic batch axis and no batch size was given.
DEFAULT_BATCH_SIZE = 16

PICKLE_MESSAGE = "holds Python objects (pickled); raysearch never loads pickles"


def declared(spec: ModelInput, array: Any) -> ModelInput:
    """``spec``, with an undeclared shape taken from the data (every dimension dynamic)."""
    if spec.shape is not None or array is None:
        return spec
    return ModelInput(spec.name, spec.dtype, (None,) * max(1, np.ndim(array)))


def feed_batch(
    inputs: Sequence[ModelInput], sample_is_feed: bool, batch_size: int | None, label: str
) -> int:
    """Samples per feed: 1 when each sample is a feed, the static batch when the model has one,
    else ``batch_size`` (default :data:`DEFAULT_BATCH_SIZE`)."""
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise DataError(f"{label}: batch size must be a positive integer, got {batch_size!r}")
    if sample_is_feed:
        return 1
    first = inputs[0]
    if not first.shape:
        return 1
    if isinstance(first.shape[0], int):
        if batch_size is not None and batch_size != first.shape[0]:
            _logger.info(
                "%s: input '%s' has a static batch of %d; batch_size %d is not used",
                label,
                first.name,
                first.shape[0],
                batch_size,
            )
        return first.shape[0]
    return int(batch_size) if batch_size is not None else DEFAULT_BATCH_SIZE


def check_arrays(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput], label: str
) -> dict[str, np.ndarray]:
    """``arrays`` checked against ``inputs``: the same names, dtypes, shapes (per batch or per
    sample), as many samples in each, at least one, and one layout for all."""
    _check_names(arrays, [i.name for i in inputs], label)
    checked = {spec.name: _check_one(spec, arrays[spec.name], label) for spec in inputs}
    counts = {name: int(array.shape[0]) for name, array in checked.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"'{k}' {v}" for k, v in counts.items())
        raise DataError(f"{label}: inputs hold different numbers of samples ({detail})")
    if next(iter(counts.values())) == 0:
        raise DataError(f"{label}: holds 0 samples")
    ranks = {a.ndim - len(s.shape) for s, a in zip(inputs, checked.values())}
    if len(ranks) > 1:
        raise DataError(
            f"{label}: some inputs have a sample axis in front of the model's shape and some "
            "do not; give every input the same layout"
        )
    return checked


def _check_names(arrays: Mapping[str, Any], names: list[str], label: str) -> None:
    extra = [k for k in arrays if k not in names]
    missing = [n for n in names if n not in arrays]
    if missing:
        hint = ""
        if len(extra) == 1 and len(missing) == 1:
            hint = f" (found '{extra[0]}' instead)"
        which = ", ".join(f"'{m}'" for m in missing)
        raise DataError(
            f"{label}: missing input {which}{hint}; the model's inputs are {', '.join(names)}"
        )
    if extra:
        raise DataError(
            f"{label}: array '{extra[0]}' is not a model input"
            + suggest(extra[0], names)
            + f"; the model's inputs are {', '.join(names)}"
        )


def _check_one(spec: ModelInput, array: Any, label: str) -> np.ndarray:
    """One input's array: a plain array of the model's dtype, shaped per batch or per sample."""
    array = as_array(array, spec.name, label)
    if array.dtype != spec.dtype:
        raise DataError(
            f"{label}: input '{spec.name}' has dtype {array.dtype}, model expects {spec.dtype}"
        )
    rank = len(spec.shape)
    if array.ndim == rank and rank > 0:
        # The samples lie along the model's own batch axis: the array is every batch at once.
        got, want = array.shape[1:], spec.shape[1:]
        what = "(the whole array, its first axis the model's batch axis)"
    elif array.ndim == rank + 1:
        # A sample axis in front of the model's shape: each sample is one feed.
        got, want = array.shape[1:], spec.shape
        what = f"({array.shape[0]} samples of shape {tuple(array.shape[1:])}, each one feed)"
    else:
        raise DataError(
            f"{label}: input '{spec.name}' has shape {tuple(array.shape)}, "
            f"model expects {spec.shape_text()}"
        )
    if any(isinstance(w, int) and g != w for g, w in zip(got, want)):
        raise DataError(
            f"{label}: input '{spec.name}' has shape {tuple(array.shape)} {what}, "
            f"model expects {spec.shape_text()}"
        )
    return array


def as_array(value: Any, name: str, where: str) -> np.ndarray:
    """``value`` as a numpy array, refusing object arrays (what a pickle would hold)."""
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: input '{name}' is not an array: {exc}") from None
    if array.dtype.hasobject:
        raise DataError(f"{where}: array '{name}' {PICKLE_MESSAGE}")
    return array
