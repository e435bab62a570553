"""Runs one search of a model with external data on a two-node Ray cluster built for the test,
in its own process (the test session's Ray is untouched). Usage:

    python -m tests.search._external_driver WORKDIR

Writes ``WORKDIR/driver.json``: the nodes, the summary, and the files the second node built
the float model from (its materialised copy, taken from the object store).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import ray

from raysearch.search import AutoSearch
from raysearch.search.runtime.transfer import model_blob, node_local_dir
from tests.external_models import external_mlp_data, make_external_mlp


def main(work: Path) -> dict:
    from ray.cluster_utils import Cluster

    model = make_external_mlp(work / "model" / "ext.onnx", location="weights.bin")
    np.savez(work / "calib.npz", **external_mlp_data(32))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        # The same bytes give the same folder: start without one from an earlier run.
        copy = node_local_dir("raysearch-models") / model_blob(model).sha256[:24]
        shutil.rmtree(copy, ignore_errors=True)
        head = ray.get_runtime_context().get_node_id()
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        result = AutoSearch(
            {
                "model": str(model),
                "calibration_data": str(work / "calib.npz"),
                "search_algo": "Grid",
                "metric": "cos",
                "tolerance": 0.9,
                "search_space": {
                    "activation_type": ["QUInt8", "QInt8"],
                    "per_channel": [True, False],
                    "calibrate_method": ["MinMax", "Percentile"],
                },
                "resources": {"max_concurrent_trials": 2},
                "output_dir": str(work / "out"),
                "keep_candidates": True,  # the test reads every candidate's model
            }
        ).run()
        shipped = sorted(p.name for p in copy.iterdir()) if copy.is_dir() else []
        shutil.rmtree(copy, ignore_errors=True)
        return {
            "nodes": nodes,
            "head": head,
            "summary": result.summary,
            "materialized": shipped,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    (folder / "driver.json").write_text(json.dumps(main(folder), default=str))
