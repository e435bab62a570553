"""The data stage: calibration and evaluation data read and checked against the model
(``DataSource``).

The names below are defined in ``raysearch.data._data``."""

from __future__ import annotations

from raysearch.data._data import (
    DEFAULT_BATCH_SIZE,
    ArrayDataReader,
    DataError,
    DataSource,
    ModelInput,
    model_inputs,
)

__all__ = [
    "DataError",
    "ModelInput",
    "DataSource",
    "ArrayDataReader",
    "model_inputs",
    "DEFAULT_BATCH_SIZE",
]
