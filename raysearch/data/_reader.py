"""Draining an ONNX Runtime ``CalibrationDataReader`` once into arrays, so the data can be
reused by every trial and hashed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raysearch.data._checks import as_array
from raysearch.data._inputs import ModelInput
from raysearch.errors import DataError

__all__ = ["drain_reader"]


def drain_reader(reader: Any, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    """Every feed of ``reader`` (``get_next()`` until it returns nothing), joined into one
    array per input: concatenated when feeds are batches, stacked when each is a sample."""
    feeds: list[Mapping[str, Any]] = []
    while True:
        feed = reader.get_next()
        if not feed:
            break
        if not isinstance(feed, Mapping):
            raise DataError(f"{where}: get_next() returned {type(feed).__name__}, expected a dict")
        feeds.append(feed)
    if not feeds:
        raise DataError(f"{where}: the reader yielded no data")
    names = list(feeds[0])
    arrays: dict[str, np.ndarray] = {}
    ranks = {i.name: len(i.shape) if i.shape is not None else None for i in inputs}
    for name in names:
        if any(feed.get(name) is None for feed in feeds):
            raise DataError(f"{where}: input '{name}' is missing from some feeds")
        pieces = [as_array(feed[name], name, where) for feed in feeds]
        rank = ranks.get(name, 0)
        if rank is None:  # undeclared shape: feeds are batches
            rank = pieces[0].ndim
        if pieces[0].ndim == rank and rank > 0:
            shapes = {p.shape[1:] for p in pieces}
            if len(shapes) > 1:
                raise DataError(f"{where}: input '{name}' changes shape between feeds: {shapes}")
            arrays[name] = np.concatenate(pieces, axis=0)
        else:
            try:
                arrays[name] = np.stack(pieces)
            except ValueError:
                raise DataError(f"{where}: input '{name}' changes shape between feeds") from None
    return arrays
