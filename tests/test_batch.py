"""Batch mode: several models searched concurrently on one Ray cluster, one of them broken."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.batch import BatchManifest, run_batch
from raysearch.cli import main
from tests.models import conv_data, make_conv_model, make_mlp_model, mlp_data

pytestmark = pytest.mark.slow


def _manifest(tmp_path):
    make_mlp_model(tmp_path / "mlp.onnx")
    make_conv_model(tmp_path / "cnn.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    np.savez(tmp_path / "cnn.npz", **conv_data(8))
    manifest = {
        "output_dir": str(tmp_path / "out"),
        "defaults": {
            "search_algo": "Grid",
            "metric": "cos",
            "tolerance": 0.9,
            "search_space": {"per_channel": [True, False], "activation_type": ["QUInt8"]},
        },
        "models": [
            {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz"},
            {"name": "cnn", "model": "cnn.onnx", "calibration_data": "cnn.npz"},
            {"name": "broken", "model": "missing.onnx", "calibration_data": "mlp.npz"},
        ],
    }
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_batch_of_three_models_reports_two_successes_and_one_failure(tmp_path, capsys):
    path = _manifest(tmp_path)
    assert main(["batch", str(path)]) == 0
    out = tmp_path / "out"
    rows = {r["name"]: r for r in pq.read_table(out / "batch_summary.parquet").to_pylist()}
    assert [rows[n]["status"] for n in ("mlp", "cnn", "broken")] == ["ok", "ok", "failed"]
    assert "model: file not found" in rows["broken"]["error"]
    for name in ("mlp", "cnn"):
        assert rows[name]["n_trials"] == 2 and rows[name]["stop_reason"] == "space_exhausted"
        assert rows[name]["best_metric"] > 0.9
        assert (out / name / "results.parquet").exists()
    md = (out / "batch_summary.md").read_text()
    assert "| broken | failed |" in md and "| mlp | ok |" in md

    # Running the same manifest again resumes: finished searches are kept, not rerun.
    before = (out / "mlp" / "summary.json").stat().st_mtime_ns
    table = run_batch(BatchManifest.load(path))
    assert (out / "mlp" / "summary.json").stat().st_mtime_ns == before
    assert table.num_rows == 3
