"""How much Ray Tune costs per trial in a raysearch search.

Runs real Grid searches (real ONNX Runtime quantization and evaluation of a small CNN) whose
trials take about 0.1 s and about 1 s of trial-engine time (the evaluation data set's size sets
the duration; calibration is shared, so most trials are cache hits), and compares the trial
engine's own time with the wall time each trial costs once the search is running:

- ``engine_s``: mean ``duration_s`` the trial engine reports (quantize + evaluate);
- ``wall_per_trial_s``: ``slots * (end of last trial - end of first) / (trials - 1)``, the
  wall time one trial occupies a slot in steady state;
- ``overhead_s``: ``wall_per_trial_s - engine_s``, what Tune and raysearch add per trial
  (target: under 0.1 s);
- ``startup_s``: from the start of the search to the first finished trial (Ray actors, the
  float reference, the first calibration).

Usage::

    python benchmarks/tune_overhead.py            # 60 + 16 trials
    python benchmarks/tune_overhead.py --quick    # 16 + 6 trials

Prints a table and writes ``benchmarks/results/tune_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raysearch.search import AutoSearch  # noqa: E402
from tests.models import conv_data, make_conv_model  # noqa: E402

#: A grid of settings that share one MinMax calibration (most trials are cache hits).
SPACE = {
    "calibrate_method": ["MinMax"],
    "activation_type": ["QUInt8", "QInt8"],
    "per_channel": [True, False],
    "reduce_range": [False, True],
    "extra_options": {
        "ActivationSymmetric": [False, True],
        "WeightSymmetric": [True, False],
        "CalibTensorRangeSymmetric": [False, True],
    },
}
#: (name, evaluation samples) giving about 0.1 s and about 1 s per trial on one core.
CASES = (("0.1s", 1000), ("1s", 16000))


def run_case(name: str, eval_samples: int, trials: int, folder: Path) -> dict:
    model = make_conv_model(folder / "cnn.onnx", channels=16, size=32)
    np.savez(folder / "calib.npz", **conv_data(64, size=32))
    np.savez(folder / f"eval_{eval_samples}.npz", **conv_data(eval_samples, size=32, seed=5))
    config = {
        "model": str(model),
        "calibration_data": str(folder / "calib.npz"),
        "eval_data": str(folder / f"eval_{eval_samples}.npz"),
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 1.0,
        "batch_size": 64,
        "measure_latency": False,
        "stop": {"iteration_limit": trials},
        "output_dir": str(folder / f"out_{name}"),
    }
    started = time.perf_counter()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    records = sorted(result.records, key=lambda r: r["elapsed_s"])
    ends = [r["elapsed_s"] for r in records]
    engine = [float(r.get("duration_s") or 0.0) for r in records]
    nodes_actors = {r.get("actor_trials") for r in records}
    slots = int(result.summary.get("slots") or 0) or _slots()
    steady = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")
    wall_per_trial = slots * steady
    engine_mean = statistics.fmean(engine)
    return {
        "case": name,
        "trials": len(records),
        "slots": slots,
        "engine_s": round(engine_mean, 4),
        "engine_median_s": round(statistics.median(engine), 4),
        "wall_per_trial_s": round(wall_per_trial, 4),
        "overhead_s": round(wall_per_trial - engine_mean, 4),
        "startup_s": round(ends[0], 3),
        "search_wall_s": round(result.summary["wall_time_s"], 3),
        "total_wall_s": round(wall, 3),
        "max_trials_per_actor": max(n for n in nodes_actors if n is not None),
        "failed": result.summary["n_failed"],
    }


def _slots() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (CI smoke run)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="Ray CPUs")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "tune_overhead.json"
    )
    args = parser.parse_args(argv)
    import ray

    ray.init(
        num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR"
    )
    counts = {"0.1s": 16, "1s": 6} if args.quick else {"0.1s": 60, "1s": 16}
    rows = []
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-") as tmp:
        for name, samples in CASES:
            folder = Path(tmp) / name
            folder.mkdir()
            rows.append(run_case(name, samples, counts[name], folder))
    header = (
        f"{'case':>5} {'trials':>6} {'slots':>5} {'engine s':>9} {'wall/trial s':>12} "
        f"{'overhead s':>10} {'startup s':>9} {'total s':>8}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['case']:>5} {r['trials']:>6} {r['slots']:>5} {r['engine_s']:>9.3f} "
            f"{r['wall_per_trial_s']:>12.3f} {r['overhead_s']:>10.3f} {r['startup_s']:>9.2f} "
            f"{r['total_wall_s']:>8.2f}"
        )
    report = {
        "benchmark": "tune_overhead",
        "quick": args.quick,
        "machine": {"cpus": args.cpus, "python": platform.python_version()},
        "ray": ray.__version__,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp_out, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
