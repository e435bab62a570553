"""One TPE search across ONNX Runtime and NNCF on a real local Ray: each trial's backend is
in ``results.parquet``, NNCF's BiasCorrection failure is a failed trial, not a failed search,
and a setting the backend refuses does not end the sampler's phase early."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysearch.search import AutoSearch
from tests.models import attention_data, make_attention_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def test_a_tpe_search_over_both_backends_survives_nncfs_failure(tmp_path):
    model = make_attention_model(tmp_path / "attention.onnx")
    np.savez(tmp_path / "calib.npz", **attention_data(16))
    space = {
        "quantizer": ["ort", "nncf"],
        "ort": {"only_if": {"quantizer": "ort"}, "per_channel": [True, False]},
        "nncf": {
            "only_if": {"quantizer": "nncf"},
            # none with fast_bias_correction: false fails inside NNCF on this model; with
            # transformer the combination is refused before it runs.
            "model_type": ["none", "transformer"],
            "fast_bias_correction": [False, True],
        },
    }
    config = {
        "model": str(model),
        "calibration_data": str(tmp_path / "calib.npz"),
        "search_space": space,
        "search_algo": "TPE",
        "seed": 0,
        "metric": "cos",
        "tolerance": 0.99,
        "measure_latency": False,
        # More than the 5 distinct settings (2 ort + 3 nncf, one more refused): the refused
        # one does not count as run, so TPE ends when all 5 ran.
        "stop": {"iteration_limit": 8},
        # One trial actor: one start of a Ray worker and one import of NNCF, not two.
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(tmp_path / "out"),
    }
    result = AutoSearch(config).run()

    table = pq.read_table(result.output_dir / "results.parquet").to_pylist()
    assert len(table) == 5
    by_backend = {q: [r for r in table if r["quantizer"] == q] for q in ("ort", "nncf")}
    assert len(by_backend["ort"]) == 2 and len(by_backend["nncf"]) == 3
    failed = [r for r in table if r["status"] == "failed"]
    assert len(failed) == 1
    assert failed[0]["quantizer"] == "nncf"
    assert failed[0]["params/nncf.model_type"] == "none"
    assert failed[0]["params/nncf.fast_bias_correction"] is False
    assert re.match(
        r"NNCF 3\.4\.\d+ failed in bias_correction \(Fail\): Error: Dup", failed[0]["error"]
    )
    assert all(r["status"] == "ok" and r["metric"] > 0.9 for r in table if r is not failed[0])
    refused = ("model_type", "transformer"), ("fast_bias_correction", False)
    assert not any(all(r[f"params/nncf.{k}"] == v for k, v in refused) for r in by_backend["nncf"])
    assert result.summary["n_trials"] == 5
    assert result.summary["stop_reason"] == "space_exhausted"
