"""Custom evaluators for the demo — and the worked example of writing one.

A custom evaluator is any function ``fn(model_path, providers)`` returning a number (or a dict
of numbers with the main metric under ``metric``, or named by ``metric_key``). raysearch scores
the float model once with the same function, and the tolerance bounds the drop against that
float score. Name it in a config as ``metric: "raysearch.demo.evaluators:top1_cos"``.

With a ``fraction`` argument it also scores the first ``fraction`` of its rows, and a search
evaluates each setting on growing subsets, stopping the hopeless ones early.

Example:
    >>> round(_score(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[0.8, 0.2], [0.6, 0.4]]))[
    ...     "top1_agreement"], 3)
    0.5
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import onnxruntime as ort

from raysearch.demo import MAGIKA_DIR, build_demo_data

__all__ = ["top1_agreement", "top1_cos"]

#: The fixed order in which a fraction of the evaluation rows is taken (first rows first).
_ORDER_SEED = 0


@functools.lru_cache(maxsize=1)
def _float_outputs() -> tuple[np.ndarray, np.ndarray]:
    """The demo evaluation rows, in the evaluators' fixed shuffled order, and the float
    model's output probabilities on them, computed once per process."""
    _, eval_path = build_demo_data()
    with np.load(eval_path, allow_pickle=False) as data:
        rows = data["bytes"]
    rows = rows[np.random.default_rng(_ORDER_SEED).permutation(len(rows))]
    return rows, _probabilities(str(MAGIKA_DIR / "model.onnx"), rows, ["CPUExecutionProvider"])


def _probabilities(model_path: str, rows: np.ndarray, providers: list) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model_path, options, providers=providers)
    name = session.get_inputs()[0].name
    return np.concatenate(
        [session.run(None, {name: rows[i : i + 100]})[0] for i in range(0, len(rows), 100)]
    ).astype(np.float64)


def _first(fraction: float | None, n: int) -> int:
    """How many of ``n`` rows ``fraction`` scores (every row for None)."""
    return n if fraction is None else max(1, min(n, math.ceil(fraction * n)))


def _score(probabilities: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Top-1 agreement with ``reference`` (the float model's probabilities on the same rows),
    the mean cosine similarity of each row's probabilities with the float model's, and the
    demo's metric: the agreement less the mean cosine distance (``1 - cos``)."""
    agree = float(np.mean(probabilities.argmax(axis=1) == reference.argmax(axis=1)))
    norms = np.linalg.norm(probabilities, axis=1) * np.linalg.norm(reference, axis=1)
    dots = np.sum(probabilities * reference, axis=1)
    cos = float(np.mean(np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)))
    return {"metric": agree - (1.0 - cos), "top1_agreement": agree, "cos": cos}


def top1_cos(model_path: str, providers: list, fraction: float | None = None) -> dict:
    """The demo's metric (higher is better; 1.0 for the float model itself): the fraction of
    the demo evaluation files whose predicted content type is the one the float magika model
    predicts, less how far the predicted probabilities moved from the float model's (the mean
    cosine distance, ``1 - cos``, per file).

    Top-1 agreement alone ties (every setting that quantizes only MatMul and Conv agrees on
    almost every file); the cosine term, below one file's worth of agreement, breaks those
    ties. ``top1_agreement`` and ``cos`` are recorded too. ``fraction``: only the first
    ``fraction`` of the rows, in a fixed shuffled order.
    """
    rows, reference = _float_outputs()
    n = _first(fraction, len(rows))
    return _score(_outputs(model_path, rows[:n], providers, reference[:n]), reference[:n])


def _outputs(
    model_path: str, rows: np.ndarray, providers: list, reference: np.ndarray
) -> np.ndarray:
    """The model's probabilities on ``rows`` (the float model's: the ``reference``, not run
    again)."""
    if os.path.realpath(model_path) == os.path.realpath(MAGIKA_DIR / "model.onnx"):
        return reference
    return _probabilities(model_path, rows, providers)


def top1_agreement(model_path: str, providers: list, fraction: float | None = None) -> float:
    """Fraction of the demo evaluation files whose predicted content type is the one the float
    magika model predicts (1.0 for the float model itself; higher is better); ``fraction``:
    only the first ``fraction`` of the files, as :func:`top1_cos`."""
    rows, reference = _float_outputs()
    n = _first(fraction, len(rows))
    probabilities = _outputs(model_path, rows[:n], providers, reference[:n])
    return _score(probabilities, reference[:n])["top1_agreement"]
