"""Runs one search on a Ray cluster built for a test, in its own process (so the test
session's own Ray instance is untouched). Usage:

    python -m tests.scale._cluster_driver multinode|fakegpu WORKDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import ray

from raysearch.search import AutoSearch
from tests.models import make_mlp_model, mlp_data


def _config(work: Path, **extra) -> dict:
    make_mlp_model(work / "mlp.onnx")
    np.savez(work / "mlp.npz", **mlp_data(32))
    return {
        "model": str(work / "mlp.onnx"),
        "calibration_data": str(work / "mlp.npz"),
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": 0.9,
        "search_space": {
            "activation_type": ["QUInt8", "QInt8"],
            "per_channel": [True, False],
            "calibrate_method": ["MinMax", "Percentile"],
        },
        "output_dir": str(work / "out"),
        **extra,
    }


def multinode(work: Path) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        result = AutoSearch(_config(work, resources={"max_concurrent_trials": 2})).run()
        return {"nodes": nodes, "summary": result.summary}
    finally:
        ray.shutdown()
        cluster.shutdown()


def fakegpu(work: Path) -> dict:
    # Two GPUs declared on a machine that has none: Ray assigns them, CUDA cannot load.
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False)
    try:
        result = AutoSearch(
            _config(work, resources={"gpu_per_trial": 0.5, "cpu_per_trial": 1})
        ).run()
        return {"summary": result.summary}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    mode, work = sys.argv[1], Path(sys.argv[2])
    out = {"multinode": multinode, "fakegpu": fakegpu}[mode](work)
    (work / "driver.json").write_text(json.dumps(out, default=str))
