"""Many models' searches on one cluster (``raysearch batch``)."""

from __future__ import annotations

from raysearch.batch._batch import BatchManifest, run_batch

__all__ = ["BatchManifest", "run_batch"]
