"""The data stage: calibration and evaluation data read and checked against the model
(``DataSource``).

The names below are defined in ``raysearch.data._data``, but :func:`latency_feeds` and
``PREFILL_TOKENS`` (``raysearch.data._lm_inputs``: the feeds a decoder's speed is timed on)."""

from __future__ import annotations

from raysearch.data._data import (
    DEFAULT_BATCH_SIZE,
    ArrayDataReader,
    DataError,
    DataSource,
    ModelInput,
    model_inputs,
)
from raysearch.data._lm_inputs import PREFILL_TOKENS, latency_feeds

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
    "DEFAULT_BATCH_SIZE",
    "latency_feeds",
    "PREFILL_TOKENS",
]
