"""Batch mode: several models searched concurrently on one Ray cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from tests.batch_checks import progress, summary_rows
from tests.models import conv_data, make_conv_model, make_mlp_model, mlp_data

pytestmark = pytest.mark.slow

MLP = {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz"}
#: Four settings of MATMUL_CONV_INT8_SEARCH's operators, both calibrations (a histogram's too)
#: and both weight granularities: each compared to the last bit with the search run alone.
SAME_AS_ALONE_SPACE = {
    "calibrate_method": ["MinMax", "Percentile"],
    "per_channel": [True, False],
    "op_types_to_quantize": [["MatMul", "Gemm", "Conv"]],
}


def _manifest(tmp_path: Path, models: list[dict], name: str = "batch.yaml") -> Path:
    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    manifest = {
        "output_dir": str(tmp_path / "out"),
        "defaults": {
            "search_algo": "Grid",
            "metric": "cos",
            "tolerance": 0.9,
            "search_space": {"per_channel": [True, False], "activation_type": ["QUInt8"]},
        },
        "models": models,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.mark.usefixtures("ray_cluster")
def test_a_batch_overwritten_counts_from_zero_and_its_best_config_runs_again(tmp_path, capsys):
    """A batch of good models only exits 0; ``--overwrite`` searches a model searched before
    again from nothing, and a model's ``best/config.yaml`` runs again as written. The batch
    joins the suite's Ray (``ray_cluster``). A batch with failed models (exit 1 after writing
    everything: the summary, each model's outputs and log, ``batch_report.html`` in Chromium,
    the progress lines) and its resume (the finished searches kept, the others searched) are
    ``tests/reliability/test_batch_faults.py``'s: a batch that starts its own Ray."""
    from raysearch import AutoSearch

    one = _manifest(tmp_path, [MLP], name="one.yaml")
    out = tmp_path / "out"
    # mlp's folder as an earlier batch leaves it: its search finished, two trials journaled
    # (run here on the suite's Ray: a batch would start a `raysearch` process for it).
    earlier = {
        **yaml.safe_load(one.read_text())["defaults"],
        "model": str(tmp_path / MLP["model"]),
        "calibration_data": str(tmp_path / MLP["calibration_data"]),
        "output_dir": str(out / "mlp"),
    }
    assert AutoSearch(earlier).run(progress=False).summary["n_trials"] == 2
    _check_overwrite_and_best_config(tmp_path, out, capsys)


def _check_overwrite_and_best_config(tmp_path: Path, out: Path, capsys) -> None:
    # --overwrite searches mlp again from nothing: its trials count from zero, never the
    # earlier search's 2 first and fewer after, and end where its summary does.
    one = _manifest(tmp_path, [MLP], name="one.yaml")
    capsys.readouterr()
    assert main(["batch", str(one), "--overwrite"]) == 0
    assert summary_rows(out)["mlp"]["status"] == "ok"
    lines = progress(capsys.readouterr().err)
    assert lines[0].startswith("[batch] models 0/1 done, 1 running, 0 failed | trials 0 done")
    counts = [int(re.search(r"\| trials (\d+) done", line)[1]) for line in lines]
    assert counts == sorted(counts) and counts[-1] == summary_rows(out)["mlp"]["n_trials"] == 2
    assert lines[-1].startswith("[batch] models 1/1 done, 0 running, 0 failed | trials 2 done")

    # A model's best/config.yaml runs again as written, the batch and its Ray gone: it names
    # no Ray address (the batch's searches joined its Ray through their environment). The Ray
    # the rerun started, if it started one, is stopped again; the session's Ray it may have
    # joined stays up for the tests after this one.
    from raysearch.search.runtime.cluster import stop_ray

    best_config = out / "mlp" / "best" / "config.yaml"
    assert "address" not in yaml.safe_load(best_config.read_text())
    rerun = tmp_path / "rerun"
    try:
        assert main(["run", str(best_config), "--output-dir", str(rerun)]) == 0
    finally:
        stop_ray()
    assert json.loads((rerun / "summary.json").read_text())["n_trials"] == 1


@pytest.mark.usefixtures("ray_cluster")
def test_a_batch_finds_what_each_search_finds_alone(tmp_path):
    """Each model's search in a batch (a process forked for it, joined to the batch's Ray, one
    trial at a time) gives the very results of the same search run alone with AutoSearch (in
    this process, two trials at a time): the same best setting and every setting's metric.
    Two models, an MLP (MatMul) and a CNN (Conv), their searches running at once, each in a
    process of its own (the same path for every model of a larger batch). The batch joins the
    suite's Ray (``ray_cluster``), as a batch joins a running cluster, and the searches alone
    run on it: three Ray starts fewer than a Ray of their own each. A batch that starts its
    Ray and stops it again is the other test's."""
    from raysearch import AutoSearch
    from tests.reliability.helpers import journal

    make_mlp_model(tmp_path / "mlp.onnx")
    make_conv_model(tmp_path / "cnn8.onnx", channels=8, size=16)
    np.savez(tmp_path / "mlp.npz", **mlp_data(32))
    np.savez(tmp_path / "cnn16.npz", **conv_data(24, size=16))
    defaults = {
        "search_space": SAME_AS_ALONE_SPACE,
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": 0.99,
        "early_stopping": False,
        "measure_latency": False,
        # Half a CPU a trial: both searches fit at once on the suite's one-CPU Ray, and the
        # searches alone run two trials at a time.
        "resources": {"cpu_per_trial": 0.5},
    }
    models = [
        {"name": "mlp", "model": "mlp.onnx", "calibration_data": "mlp.npz"},
        {"name": "cnn8", "model": "cnn8.onnx", "calibration_data": "cnn16.npz"},
    ]
    out = tmp_path / "out"
    manifest = {"output_dir": str(out), "defaults": defaults, "models": models}
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump(manifest))
    assert main(["batch", str(tmp_path / "batch.yaml")]) == 0

    def metrics(folder: Path) -> dict[str, float]:
        records = journal(folder)
        assert len(records) == 4 and all(r["status"] == "ok" for r in records), folder
        return {json.dumps(r["params"], sort_keys=True): r["metric"] for r in records}

    for entry in models:
        alone = {**defaults, **{k: v for k, v in entry.items() if k != "name"}}
        for key in ("model", "calibration_data"):
            alone[key] = str(tmp_path / alone[key])
        alone["output_dir"] = str(tmp_path / "alone" / entry["name"])
        result = AutoSearch(alone).run(progress=False)
        batch = json.loads((out / entry["name"] / "summary.json").read_text())
        # Every setting scored the same to the last bit, not only the best.
        scores = metrics(Path(alone["output_dir"]))
        assert metrics(out / entry["name"]) == scores, entry["name"]
        assert batch["best_metric"] == result.best_metric, entry["name"]
        # The same best setting, or one that ties with it exactly.
        best = json.dumps(batch["best_params"], sort_keys=True)
        assert scores[best] == result.best_metric, (entry["name"], best, result.best_params)
