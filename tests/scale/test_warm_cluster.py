"""A running cluster keeps what a later search of the same model needs (issue 37 item 2): the
float reference, kept by the first search on a cluster started with ``ray start --head``, is
reused by the second, whose results equal a search on a Ray of its own."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.drivers import run_driver
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


def _outputs(config: Path) -> tuple[dict, dict[str, float], str]:
    """What the search of ``config`` wrote: its summary, each setting's metric, its log."""
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
    first = _config(tmp_path, model, data, "first", address="auto")
    # No address, RAY_ADDRESS set: that cluster is joined (as by `address: auto` above and
    # below), and what it keeps is reused.
    second = _config(tmp_path, model, data, "second")
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
    own = _config(tmp_path, model, data, "own")
    # A short folder: Ray's socket paths under it must stay below 108 bytes.
    default_tmp = Path(tempfile.mkdtemp(prefix="rs-tmp-"))
    try:
        with NodeCluster(lean=True) as cluster:
            cluster.start("head", num_cpus=2)
            # No address, no RAY_ADDRESS: a Ray of the search's own beside the running one
            # (the cold search the ones on the cluster must equal: nothing kept, nothing
            # reused). A `ray start --head` with Ray's default temp folder names itself in
            # <TMPDIR>/ray/ray_current_cluster, which ray.init() without an address joins
            # (and then refuses num_cpus): that file, as Ray writes it, in the search's TMPDIR.
            (default_tmp / "ray").mkdir()
            (default_tmp / "ray" / "ray_current_cluster").write_text(str(cluster.address))
            # The four searches one after the other in one driver process, each a Ray driver
            # of its own as a `raysearch run` is: one interpreter and its imports for all.
            # The cluster's token stays set for the last one (Ray keeps the token it read in
            # the process): its own Ray takes it too.
            joined = {name: cluster.env[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
            searches = [
                {"config": str(first), "env": {**joined, "RAY_ADDRESS": cluster.address}},
                {"config": str(second)},
                {"config": str(changed)},
                {"config": str(own), "env": {"RAY_ADDRESS": None, "TMPDIR": str(default_tmp)}},
            ]
            (tmp_path / "searches.json").write_text(json.dumps(searches))
            done, _ = run_driver(
                tmp_path, "tests.scale._searches_driver", str(tmp_path), timeout_s=540
            )
    finally:
        shutil.rmtree(default_tmp, ignore_errors=True)
    assert done == {s["config"]: {} for s in searches}, done
    first_summary, first_metrics, first_log = _outputs(first)
    second_summary, second_metrics, second_log = _outputs(second)
    changed_summary, _, changed_log = _outputs(changed)
    cold_summary, cold, cold_log = _outputs(own)

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
