"""Custom evaluators for the demo — and the worked example of writing one.

A custom evaluator is any function ``fn(model_path, providers)`` returning a number (or a dict
of numbers with the main metric named by ``metric_key``). raysearch scores the float model once
with the same function, and the tolerance bounds the drop against that float score. Name it in a
config as ``metric: "raysearch.demo.evaluators:top1_agreement"``.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from raysearch.demo import MAGIKA_DIR, build_demo_data

__all__ = ["top1_agreement"]


@functools.lru_cache(maxsize=1)
def _float_top1() -> tuple[np.ndarray, np.ndarray]:
    """The demo evaluation rows and the float model's predicted labels, computed once."""
    _, eval_path = build_demo_data()
    with np.load(eval_path, allow_pickle=False) as data:
        rows = data["bytes"]
    return rows, _predict(str(MAGIKA_DIR / "model.onnx"), rows, ["CPUExecutionProvider"])


def _predict(model_path: str, rows: np.ndarray, providers: list) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model_path, options, providers=providers)
    name = session.get_inputs()[0].name
    return np.concatenate(
        [
            session.run(None, {name: rows[i : i + 100]})[0].argmax(axis=1)
            for i in range(0, len(rows), 100)
        ]
    )


def top1_agreement(model_path: str, providers: list) -> float:
    """Fraction of the demo evaluation files whose predicted content type is the one the float
    magika model predicts (1.0 for the float model itself; higher is better)."""
    rows, reference = _float_top1()
    return float(np.mean(_predict(model_path, rows, providers) == reference))
