"""The data stage: calibration and evaluation data read and checked against the model
(``DataSource``), and the feeds a decoder's speed is timed on (``_lm_inputs``)."""

from __future__ import annotations

from raysearch.data._data import ArrayDataReader, DataError, DataSource, ModelInput, model_inputs
from raysearch.data._lm_inputs import latency_feeds, next_step_feed, past_outputs

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
    "latency_feeds",
    "next_step_feed",
    "past_outputs",
]
