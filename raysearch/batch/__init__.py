"""Many models' searches on one cluster (``raysearch batch``).

The names below are defined in ``raysearch.batch._batch``."""

from __future__ import annotations

from raysearch.batch._batch import (
    BATCH_COLUMNS,
    BatchManifest,
    ModelEntry,
    run_batch,
)

__all__ = [
    "BatchManifest",
    "ModelEntry",
    "run_batch",
    "BATCH_COLUMNS",
]
