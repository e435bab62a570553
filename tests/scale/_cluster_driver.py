"""Runs one search on a Ray cluster built for a test, in its own process (so the test
session's own Ray instance is untouched). Usage:

    python -m tests.scale._cluster_driver multinode WORKDIR
    python -m tests.scale._cluster_driver fakegpu WORKDIR GPUS GPU_PER_TRIAL

The search scores with the probe evaluator (``tests.reliability.evaluators``), which logs every
call to ``WORKDIR/calls.jsonl`` from the process that makes it: the model file it scored, the
Ray node and ``CUDA_VISIBLE_DEVICES`` of that process. The tests read what happened during the
run from that log, not from what is left after it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray

from raysearch.search import AutoSearch
from tests.reliability.helpers import PROBE, plan_model, write_data

#: Seconds each quantized model's scoring sleeps: trials overlap long enough to be counted.
SLEEP_S = 1.0


def _config(work: Path, **extra) -> dict:
    model = plan_model(work / "mlp.onnx", work / "calls.jsonl", sleep_s=SLEEP_S)
    return {
        "model": str(model),
        "calibration_data": str(write_data(work / "mlp.npz", 32)),
        "search_algo": "Grid",
        "metric": PROBE,
        "higher_is_better": True,
        # Every setting is a candidate: every model, wherever it was made, is kept.
        "tolerance": 1000.0,
        "tolerance_mode": "absolute",
        "keep_candidates": True,
        "measure_latency": False,
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
        driver = ray.get_runtime_context().get_node_id()
        result = AutoSearch(_config(work, resources={"max_concurrent_trials": 2})).run()
        return {"nodes": nodes, "driver_node": driver, "summary": result.summary}
    finally:
        ray.shutdown()
        cluster.shutdown()


def fakegpu(work: Path, gpus: int, share: float) -> dict:
    # GPUs declared on a machine that has none: Ray assigns them, CUDA cannot load. The CPUs
    # allow 8 trials at once, so only the GPU share can hold them to gpus / share.
    ray.init(num_cpus=8, num_gpus=gpus, include_dashboard=False)
    try:
        config = _config(work, resources={"gpu_per_trial": share, "cpu_per_trial": 1})
        result = AutoSearch(config).run()
        return {"summary": result.summary}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    mode, work = sys.argv[1], Path(sys.argv[2])
    if mode == "multinode":
        out = multinode(work)
    else:
        out = fakegpu(work, int(sys.argv[3]), float(sys.argv[4]))
    (work / "driver.json").write_text(json.dumps(out, default=str))
