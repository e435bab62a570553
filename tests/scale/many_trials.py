"""A many-trial search on a multi-node cluster, watched from outside, with one worker node
killed part-way. Shared by ``benchmarks/scale.py`` (1,000 trials, the figures) and
``tests/scale/test_many_trials.py`` (40 trials, the behaviour).

The cluster is real: one head and ``workers`` worker nodes, each a ``ray start --block`` on
loopback with one CPU (:class:`tests.nodes.NodeCluster`). The search is ``raysearch run`` as a
process of its own that joins the cluster (``address``): a Grid over :data:`SPACE` (1,024 valid
settings) on the test MLP, scored by the built-in ``cos`` metric on 640 evaluation rows, with
evaluation on growing subsets (the default ``early_stopping``: rungs of 10 %, 33 % and 100 % of
the rows; ASHA keeps the best third at each rung), so each trial is short (about 0.1 s of
work) and the search's own costs show.

While it runs, every ``sample_s``: the trials journaled (the journal's lines, counted as they
are appended), and the driver process's resident memory and CPU time (``/proc``). Once
``kill_at`` trials are journaled, the last worker node is killed (SIGKILL of every process of
that node; the driver and the other nodes stay), and the ids journaled by then are kept: each
must be in the search's outputs at the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.models import make_mlp_model, mlp_data
from tests.nodes import NodeCluster
from tests.reliability.helpers import journal, start_raysearch, stop_leftovers, write_config

#: 2 x 2 x 2 x 2 x 2 x 32 = 1,024 settings, every one valid on the MLP (`raysearch validate`);
#: 32 percentiles of one histogram: calibration runs once per actor, the rest is a cache hit.
SPACE: dict[str, Any] = {
    "calibrate_method": "Percentile",
    "activation_type": ["QUInt8", "QInt8"],
    "per_channel": [True, False],
    "reduce_range": [False, True],
    "extra_options": {
        "ActivationSymmetric": [False, True],
        "WeightSymmetric": [True, False],
        "CalibPercentile": [float(round(p, 4)) for p in np.linspace(99.0, 99.999, 32)],
    },
}
#: Evaluation rows: 640 is twice the 320 the default rungs need (32 rows in the first rung).
EVAL_ROWS = 640
#: A tolerance a few settings meet (cos 0.99963 is the best on this model): the search keeps
#: candidates' models, and ASHA may stop every other trial (a possible candidate is protected).
TOLERANCE = 0.9995
_TICKS = os.sysconf("SC_CLK_TCK")


def scale_config(
    work: Path, trials: int, address: str, reduction_factor: float | None = None
) -> dict[str, Any]:
    """The search's config: the model and data made in ``work``, output in ``work/out``;
    early stopping's ``reduction_factor`` when given (else its default)."""
    model = make_mlp_model(work / "mlp.onnx")
    np.savez(work / "calib.npz", **mlp_data(64, seed=1))
    np.savez(work / "eval.npz", **mlp_data(EVAL_ROWS, seed=2))
    config: dict[str, Any] = {
        "model": str(model),
        "calibration_data": str(work / "calib.npz"),
        "eval_data": str(work / "eval.npz"),
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": TOLERANCE,
        "seed": 0,
        "stop": {"iteration_limit": trials, "find_n_candidates": -1},
        "measure_latency": False,
        "address": address,
        "output_dir": str(work / "out"),
    }
    if reduction_factor is not None:
        config["early_stopping"] = {"reduction_factor": reduction_factor}
    return config


class _LineCounter:
    """Lines of a file that only grows, counted from where the last call stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return 0
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


def _process(pid: int) -> tuple[int | None, float | None]:
    """Resident bytes and CPU seconds (user + system) of ``pid``; None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None, None
    rss = next(
        (int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")),
        None,
    )
    # Fields after the command: state is 0, so utime and stime are 11 and 12.
    return rss, (int(stat[11]) + int(stat[12])) / _TICKS


def run_many_trials(
    work: Path,
    trials: int,
    kill_at: int | None,
    *,
    workers: int = 3,
    sample_s: float = 0.1,
    timeout_s: float = 3600,
    reduction_factor: float | None = None,
    lean: bool = False,
) -> dict[str, Any]:
    """Start the cluster (``lean``: a lean :class:`~tests.nodes.NodeCluster`), run the search
    (early stopping's ``reduction_factor`` when given), kill the last worker node at
    ``kill_at`` journaled trials (None: never), stop the cluster. What was seen:

    ``status`` (the search's exit status), ``wall_s``, ``out`` (its output folder),
    ``nodes`` (the nodes started), ``samples`` (``[seconds, trials journaled, driver RSS
    bytes, driver CPU seconds]``), ``killed`` (None, or the node, the trials journaled when it
    was killed, the pids killed and ``journaled_ids``: the trial ids journaled by then) and
    ``stderr_tail``."""
    work.mkdir(parents=True, exist_ok=True)
    names = ["head"] + [f"worker{i + 1}" for i in range(workers)]
    with NodeCluster(lean=lean) as cluster:
        # One after the other: a raylet that the GCS has not registered within Ray's 30 s
        # (nodes started together on a loaded machine) ends its node.
        for name in names:
            cluster.start(name, num_cpus=1)
        config = scale_config(work, trials, cluster.address, reduction_factor)
        path = write_config(work / "config.yaml", config)
        out = Path(config["output_dir"])
        counter = _LineCounter(out / "journal.jsonl")
        samples: list[list[float]] = []
        killed: dict[str, Any] | None = None
        started = time.monotonic()
        proc = start_raysearch(["run", str(path)], work, **cluster.env)
        try:
            while proc.poll() is None:
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"the search ran past {timeout_s} s")
                done = counter.count()
                rss, cpu = _process(proc.pid)
                if rss is not None:
                    samples.append([round(time.monotonic() - started, 3), done, rss, cpu])
                if kill_at is not None and killed is None and done >= kill_at:
                    ids = [r["trial_id"] for r in journal(out)]
                    pids = cluster.kill(names[-1])
                    killed = {"node": names[-1], "at_trials": len(ids), "pids": pids}
                    killed["journaled_ids"] = ids
                time.sleep(sample_s)
            status = proc.wait()
        finally:
            stop_leftovers(proc)
    wall_s = time.monotonic() - started
    stderr = (work / "stderr.txt").read_text(errors="replace")
    return {
        "status": status,
        "wall_s": round(wall_s, 2),
        "out": out,
        "nodes": names,
        "samples": samples,
        "killed": killed,
        "stderr_tail": stderr[-3000:],
    }
