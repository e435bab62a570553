"""Ray Tune's experiment folder may live behind a URI (pyarrow file systems: s3://, gs://,
file://); raysearch's own outputs stay in output_dir."""

from __future__ import annotations

import json

import pytest

from raysearch.search import AutoSearch

pytestmark = pytest.mark.slow


def test_storage_path_uri_holds_tune_state_and_outputs_stay_local(ray_cluster, mlp_files, tmp_path):
    store = tmp_path / "store"
    config = {
        "model": str(mlp_files["model"]),
        "calibration_data": str(mlp_files["data"]),
        "search_algo": "Grid",
        "search_space": {"per_channel": [True, False]},
        "output_dir": str(tmp_path / "out"),
        "storage_path": store.as_uri(),
        # One trial actor: trials side by side are not this test's subject.
        "resources": {"max_concurrent_trials": 1},
    }
    result = AutoSearch(config).run()
    assert result.summary["n_trials"] == 2
    assert list(store.glob("*/experiment_state-*.json")), "Tune's state is under the URI"
    assert not (tmp_path / "out" / "ray_results").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stop_reason"] == "space_exhausted"
    again = AutoSearch.resume(tmp_path / "out")
    assert again.summary["n_trials"] == 2 and again.best_metric == result.best_metric
