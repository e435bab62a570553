"""Fixtures for the search tests: one real local Ray (one CPU) for the session, small real
models and data, and a config builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.models import make_mlp_model, mlp_data

REPO = Path(__file__).resolve().parents[2]

#: A conditional space whose groups are active only for some choices (both dialects' features:
#: only_if groups, a float range, categorical lists).
CONDITIONAL_SPACE: dict[str, Any] = {
    "calibrate_method": ["MinMax", "Percentile"],
    "activation_type": ["QUInt8", "QInt8"],
    "per_channel": [True, False],
    "extra_options": {
        "pct": {
            "only_if": {"calibrate_method": "Percentile"},
            "CalibPercentile": {"type": "float", "low": 99.0, "high": 99.999},
        },
        "sym": {"only_if": {"activation_type": "QInt8"}, "ActivationSymmetric": [True, False]},
    },
}


@pytest.fixture(scope="session")
def mlp_files(tmp_path_factory) -> dict[str, Path]:
    """A small MLP and 64 calibration samples (also the evaluation data)."""
    folder = tmp_path_factory.mktemp("mlp")
    model = make_mlp_model(folder / "mlp.onnx")
    data = folder / "calib.npz"
    np.savez(data, **mlp_data(64))
    return {"model": model, "data": data}


@pytest.fixture
def make_config(mlp_files, tmp_path):
    """``make_config(**overrides)``: a valid config dict for the MLP, output in tmp_path."""

    def build(**overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "model": str(mlp_files["model"]),
            "calibration_data": str(mlp_files["data"]),
            "search_space": {
                "calibrate_method": ["MinMax", "Percentile"],
                "activation_type": ["QUInt8", "QInt8"],
                "per_channel": [True, False],
            },
            "search_algo": "Grid",
            "metric": "L2",
            "tolerance": 0.05,
            "seed": 0,
            "output_dir": str(tmp_path / "out"),
        }
        config.update(overrides)
        return config

    return build
