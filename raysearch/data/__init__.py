"""The data stage: calibration and evaluation data read and checked against the model
(``DataSource``), and the feeds a decoder's speed is timed on (``_lm_inputs``)."""

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
