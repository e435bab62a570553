"""Evaluators for the batch reliability test, importable by the searches it starts."""

from __future__ import annotations

import time


def raises(model_path: str, providers: list) -> float:
    """Fails on every model, the float one included."""
    raise RuntimeError("the evaluator broke on purpose")


def hangs(model_path: str, providers: list) -> float:
    """Never returns, the float model included (the batch's model_timeout_s stops it)."""
    time.sleep(3600)
    return 0.0
