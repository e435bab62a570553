"""Custom evaluators for the tests, imported as ``"tests.evaluators_fixture:<name>"``.

Each follows the evaluator contract ``fn(model_path, providers) -> float | dict``.
"""

from __future__ import annotations

import onnxruntime as ort

from tests.models import mlp_data

CALLS: list[str] = []


def mean_output(model_path: str, providers: list) -> float:
    """Mean of the model's output on 32 fixed MLP inputs (higher is "better" by fiat)."""
    CALLS.append(model_path)
    session = ort.InferenceSession(model_path, providers=providers)
    return float(session.run(None, mlp_data(32, seed=7))[0].mean())


def output_stats(model_path: str, providers: list) -> dict:
    """``{"mean": ..., "max": ...}`` of the output on the same inputs (needs ``metric_key``)."""
    session = ort.InferenceSession(model_path, providers=providers)
    out = session.run(None, mlp_data(32, seed=7))[0]
    return {"mean": float(out.mean()), "max": float(out.max())}


def returns_text(model_path: str, providers: list) -> str:
    return "good"


def returns_nan(model_path: str, providers: list) -> float:
    return float("nan")


def wrong_signature(model_path: str) -> float:
    return 1.0


not_callable = 3


def noisy_mean_output(model_path: str, providers: list) -> float:
    """:func:`mean_output`, writing to file descriptor 2 first, as ONNX Runtime's C++ logger
    does when a session opens on a model with an unused initializer."""
    import os

    os.write(2, b"[W:onnxruntime:, graph.cc:5777] Removing initializer 'unused_w'.\n")
    return mean_output(model_path, providers)
