"""A running cluster keeps what a later search of the same model needs (issue 37 item 2): the
float reference, kept by the first search on a cluster started with ``ray start --head``, is
reused by the second, whose results equal a search on a Ray of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.models import conv_data, make_conv_model
from tests.nodes import NodeCluster

pytestmark = pytest.mark.slow

#: The settings each search runs (four): each one's metric and the best are compared with the
#: cold search's.
SPACE = {"calibrate_method": ["MinMax", "Percentile"], "activation_type": ["QUInt8", "QInt8"]}


def _config(work: Path, model: Path, data: Path, out: str, **extra) -> Path:
    config = {
        "model": str(model),
        "calibration_data": str(data),
        "search_algo": "Grid",
        "metric": "cos",
        "early_stopping": False,
        "measure_latency": False,
        "search_space": SPACE,
        # One trial at a time: one trial actor per search (none of these checks is about
        # trials side by side).
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": 1},
        "output_dir": str(work / out),
        **extra,
    }
    path = work / f"{out}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(config: Path, env: dict[str, str], *args: str) -> tuple[dict, dict[str, float], str]:
    done = subprocess.run(
        [sys.executable, "-m", "raysearch", "run", str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = Path(yaml.safe_load(config.read_text())["output_dir"])
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    metrics = {json.dumps(r["settings"], sort_keys=True): r["metric"] for r in rows}
    return summary, metrics, (out / "auto_search.log").read_text()


def test_a_second_search_on_a_cluster_reuses_the_float_reference_and_equals_a_cold_one(
    tmp_path: Path,
) -> None:
    model = make_conv_model(tmp_path / "conv.onnx", channels=8, size=16)
    data = tmp_path / "data.npz"
    np.savez(data, **conv_data(96))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    with NodeCluster() as cluster:
        cluster.start("head", num_cpus=2)
        joined = {**cluster.env, "RAY_ADDRESS": cluster.address}
        first = _config(tmp_path, model, data, "first", address="auto")
        first_summary, first_metrics, first_log = _run(first, joined)
        # No address, RAY_ADDRESS set: that cluster is joined (as by `address: auto` above and
        # below), and what it keeps is reused.
        second = _config(tmp_path, model, data, "second")
        second_summary, second_metrics, second_log = _run(second, joined)
        # Another evaluation set is another key: nothing stale is served.
        other = tmp_path / "other.npz"
        np.savez(other, **conv_data(64, seed=5))
        # One setting: what is checked is the reference, not the trials.
        changed = _config(
            tmp_path,
            model,
            data,
            "changed",
            address="auto",
            eval_data=str(other),
            search_space={"calibrate_method": ["MinMax"]},
        )
        changed_summary, _, changed_log = _run(changed, joined)
        # No address, no RAY_ADDRESS: a Ray of the search's own beside the running one (the
        # cold search the ones on the cluster must equal: nothing kept, nothing reused). A
        # `ray start --head` with Ray's default temp folder names itself in
        # <TMPDIR>/ray/ray_current_cluster, which ray.init() without an address joins (and
        # then refuses num_cpus): that file, as Ray writes it, in the search's TMPDIR.
        # A short folder: Ray's socket paths under it must stay below 108 bytes.
        default_tmp = Path(tempfile.mkdtemp(prefix="rs-tmp-"))
        (default_tmp / "ray").mkdir()
        (default_tmp / "ray" / "ray_current_cluster").write_text(str(cluster.address))
        own = _config(tmp_path, model, data, "own")
        try:
            cold_summary, cold, cold_log = _run(own, {**env, "TMPDIR": str(default_tmp)})
        finally:
            shutil.rmtree(default_tmp, ignore_errors=True)

    assert first_summary["kept_warm"] == {"float_reference": False}
    assert "kept on the cluster for later searches: reference" in first_log
    assert second_summary["kept_warm"] == {"float_reference": True}
    assert "float reference reused from the cluster" in second_log
    assert changed_summary["kept_warm"] == {"float_reference": False}
    assert "float reference reused" not in changed_log
    # The same metric for every setting, the same best, as on a Ray of the search's own.
    assert len(cold) == 4
    assert first_metrics == cold
    assert second_metrics == cold
    for summary in (first_summary, second_summary):
        assert summary["best_params"] == cold_summary["best_params"]
        assert summary["best_metric"] == cold_summary["best_metric"]
    assert "float reference reused" not in cold_log + first_log
    assert cold_summary["kept_warm"] is None  # its own Ray: nothing kept
