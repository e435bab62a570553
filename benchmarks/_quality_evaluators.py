"""Task evaluators of ``benchmarks/quality.py``, importable by Ray's trial workers (the
benchmark puts this folder on their ``PYTHONPATH``).

``magika_top1``: the fraction of magika's evaluation rows (the file named by
``RAYSEARCH_QUALITY_MAGIKA_EVAL``) whose predicted content type is the float model's
(``RAYSEARCH_QUALITY_MAGIKA_MODEL``).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnxruntime as ort


def _predict(model_path: str, rows: np.ndarray, providers: list) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=providers)
    name = session.get_inputs()[0].name
    return np.concatenate(
        [
            session.run(None, {name: rows[i : i + 100]})[0].argmax(axis=1)
            for i in range(0, len(rows), 100)
        ]
    )


@functools.lru_cache(maxsize=1)
def _reference() -> tuple[np.ndarray, np.ndarray]:
    with np.load(os.environ["RAYSEARCH_QUALITY_MAGIKA_EVAL"], allow_pickle=False) as data:
        rows = data["bytes"]
    model = os.environ["RAYSEARCH_QUALITY_MAGIKA_MODEL"]
    return rows, _predict(model, rows, ["CPUExecutionProvider"])


def magika_top1(model_path: str, providers: list) -> float:
    """Top-1 agreement of ``model_path`` with the float magika model (1.0 for itself)."""
    rows, reference = _reference()
    return float(np.mean(_predict(model_path, rows, providers) == reference))
