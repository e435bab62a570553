"""The data stage: calibration and evaluation data read and checked against the model
(``DataSource``).

The names below are defined in ``raysearch.data._data``, but :func:`latency_feeds`,
:func:`past_outputs`, :func:`next_step_feed` and ``PREFILL_TOKENS``
(``raysearch.data._lm_inputs``: the feeds a decoder's speed is timed on, a decode step
after another against its key/value cache)."""

from __future__ import annotations

from raysearch.data._data import (
    DEFAULT_BATCH_SIZE,
    ArrayDataReader,
    DataError,
    DataSource,
    ModelInput,
    model_inputs,
)
from raysearch.data._lm_inputs import PREFILL_TOKENS, latency_feeds, next_step_feed, past_outputs

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
    "DEFAULT_BATCH_SIZE",
    "latency_feeds",
    "next_step_feed",
    "past_outputs",
    "PREFILL_TOKENS",
]
