"""Runs searches on Ray clusters built for a test, one after the other in one process of its
own (so the test session's own Ray instance is untouched, and the interpreter, Ray and Ray
Tune are imported once for all of them). Usage:

    python -m tests.scale._cluster_driver WORKDIR PHASE...

where each PHASE is ``multinode`` (a two-node cluster, on which a search of a model with
external data follows the first search, in ``WORKDIR/multinode/external``) or
``fakegpu:GPUS:GPU_PER_TRIAL`` (a one-node Ray that declares GPUS GPUs it does not have).
Each phase runs in its own folder ``WORKDIR/PHASE`` (``:`` written ``-``), with its own Ray
started and shut down, and file descriptor 2 pointed at ``stderr.txt`` there for as long as it
runs: what the phase's searches and its Ray wrote to the console is that file.
``WORKDIR/driver.json`` maps each phase to what it returned, or to ``{"error": traceback}``
when it failed (the next phases still run).

The searches (the external-data one aside, which scores by ``cos``) score with the probe
evaluator (``tests.reliability.evaluators``), which logs every call to the phase folder's
``calls.jsonl`` from the process that makes it: the model file it scored, the Ray node and
``CUDA_VISIBLE_DEVICES`` of that process. The tests read what happened during the run from
that log, not from what is left after it. Ray and raysearch are imported by the phases, not by
this module (the tests import :func:`phase_folder`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.reliability.helpers import PROBE, plan_model, write_data

#: Seconds each quantized model's scoring sleeps: trials overlap long enough to be counted.
SLEEP_S = 1.0


def phase_folder(work: Path, phase: str) -> Path:
    """The folder phase ``phase`` runs in."""
    return work / phase.replace(":", "-")


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
    import ray
    from ray.cluster_utils import Cluster

    from raysearch.search import AutoSearch

    # No dashboard, no autoscaler monitor, no idle worker per CPU for the driver: nothing of
    # the searches uses them (as tests.nodes.LEAN_HEAD). The log monitor stays: it brings the
    # trials' console output to this driver's stderr. A worker process idle on a node is kept
    # for a minute (Ray kills one past the node's CPU count after 1 s): the driver fetches
    # each model from the other node with tasks there, whose one process then serves every
    # fetch of the search instead of a new one started (and Python imported) for each.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "include_dashboard": False,
            "no_monitor": True,
            "_system_config": {
                "prestart_worker_first_driver": False,
                "idle_worker_killing_time_threshold_ms": 60_000,
            },
        },
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        driver = ray.get_runtime_context().get_node_id()
        result = AutoSearch(_config(work, resources={"max_concurrent_trials": 2})).run()
        return {
            "nodes": nodes,
            "driver_node": driver,
            "summary": result.summary,
            "external": _external_search(work / "external"),
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


def _external_search(work: Path) -> dict:
    """A search of a model with external data on the running cluster: its summary, and the
    files the second node built the float model from (its materialised copy, taken from the
    object store)."""
    import numpy as np

    from raysearch.quantize.tempdirs import private_dir
    from raysearch.search import AutoSearch
    from raysearch.search.runtime.transfer import model_blob
    from tests.external_models import external_mlp_data, make_external_mlp

    model = make_external_mlp(work / "model" / "ext.onnx", location="weights.bin")
    np.savez(work / "calib.npz", **external_mlp_data(32))
    # The same bytes give the same folder: start without one from an earlier run.
    copy = private_dir("raysearch-models") / model_blob(model).sha256[:24]
    shutil.rmtree(copy, ignore_errors=True)
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
            },
            "resources": {"max_concurrent_trials": 2},
            "output_dir": str(work / "out"),
            "keep_candidates": True,  # the test reads every candidate's model
        }
    ).run()
    shipped = sorted(p.name for p in copy.iterdir()) if copy.is_dir() else []
    shutil.rmtree(copy, ignore_errors=True)
    return {"summary": result.summary, "materialized": shipped}


def fakegpu(work: Path, gpus: int, share: float) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from raysearch.search import AutoSearch

    # GPUs declared on a machine that has none: Ray assigns them, CUDA cannot load. The CPUs
    # allow 8 trials at once, so only the GPU share can hold them to gpus / share. No worker
    # is started ahead for the CPUs (Ray's default starts one per CPU, 8 here, for tasks this
    # search never runs; its trials' actors start their own, as on a search's own Ray), and
    # no autoscaler monitor (as the two-node cluster above).
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 8,
            "num_gpus": gpus,
            "include_dashboard": False,
            "no_monitor": True,
            "_system_config": {"prestart_worker_first_driver": False},
        },
    )
    ray.init(address=cluster.address)
    try:
        config = _config(work, resources={"gpu_per_trial": share, "cpu_per_trial": 1})
        result = AutoSearch(config).run()
        return {"summary": result.summary}
    finally:
        ray.shutdown()
        cluster.shutdown()


def _run_phase(work: Path, run: Callable[[Path], dict]) -> dict:
    """``run(work)`` with file descriptor 2 on ``work/stderr.txt``; what it returned, or
    ``{"error": traceback}`` (written to that file too)."""
    work.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    console = os.dup(2)
    try:
        with open(work / "stderr.txt", "w") as err:
            os.dup2(err.fileno(), 2)
            try:
                return run(work)
            except Exception:
                text = traceback.format_exc()
                print(text, file=sys.stderr)
                return {"error": text}
            finally:
                sys.stderr.flush()
    finally:
        os.dup2(console, 2)
        os.close(console)


def _phase(spec: str) -> Callable[[Path], dict]:
    if spec == "multinode":
        return multinode
    mode, gpus, share = spec.split(":")
    assert mode == "fakegpu", spec
    return lambda work: fakegpu(work, int(gpus), float(share))


if __name__ == "__main__":
    work, phases = Path(sys.argv[1]), sys.argv[2:]
    out = {spec: _run_phase(phase_folder(work, spec), _phase(spec)) for spec in phases}
    (work / "driver.json").write_text(json.dumps(out, default=str))
