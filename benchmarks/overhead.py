"""How much raysearch (Ray Tune, the searcher, the recorder) adds to each trial's own work.

Runs real Grid searches (real ONNX Runtime quantization and evaluation of a small CNN,
``tests.models.make_conv_model``) whose trials take about 0.1 s, 1 s and 10 s of trial-engine
time (the evaluation set's size and the CNN's width set the duration; calibration is shared, so
most trials are cache hits), and compares the trial engine's own time with the wall time each
trial costs once the search is running. ``cpu_per_trial: 1``, as many trials at once as CPUs.

- ``engine_s``: mean ``duration_s`` the trial engine reports (quantize + evaluate);
- ``wall_per_trial_s``: ``slots * (end of last trial - end of first) / (trials - 1)``, the wall
  time one trial occupies a slot in steady state (needs many trials to be exact);
- ``overhead_s``: ``wall_per_trial_s - engine_s``;
- ``actor_gap_overhead_s``: per actor, the time between the ends of two consecutive trials
  minus the second trial's engine time, averaged: exactly what the search adds between two
  trials on one actor (result delivery, recording, next suggestion, actor reset), also with few
  trials. This is the figure the targets are judged on;
- ``startup_s``: from the start of the search to the first finished trial (Ray actors, the
  float reference, the first calibration).

Targets: overhead under 0.1 s per trial, and under 5 % of a 1 s trial.

Usage::

    python benchmarks/overhead.py            # 60 + 16 + 8 trials
    python benchmarks/overhead.py --quick    # 16 + 6 + 4 trials
    python benchmarks/overhead.py --smoke    # 6 + 4 tiny trials, no 10 s case (tests)

Prints a table and writes ``benchmarks/results/overhead.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    init_ray,
    one_calibration_space,
    print_table,
    quiet,
    shutdown_ray,
)

from raysearch.search import AutoSearch  # noqa: E402
from tests.models import conv_data, make_conv_model  # noqa: E402

#: A grid of settings that share one MinMax calibration (most trials are cache hits).
SPACE = one_calibration_space()
#: (name, CNN channels, evaluation samples) giving about 0.1 s, 1 s and 10 s per trial on one
#: core of the 2-core benchmark machine.
CASES = (("0.1s", 16, 1000), ("1s", 16, 16000), ("10s", 128, 20000))
COUNTS = {
    "full": {"0.1s": 60, "1s": 16, "10s": 8},
    "quick": {"0.1s": 16, "1s": 6, "10s": 4},
    "smoke": {"0.1s": 6, "1s": 4},
}


def run_case(name: str, channels: int, eval_samples: int, trials: int, folder: Path) -> dict:
    model = make_conv_model(folder / "cnn.onnx", channels=channels, size=32)
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
        "resources": {"cpu_per_trial": 1},
        "stop": {"iteration_limit": trials},
        "output_dir": str(folder / f"out_{name}"),
        # One report per trial, on every row: the overhead of a trial as it was measured
        # (evaluation on growing subsets is partial_eval.py's).
        "early_stopping": False,
    }
    started = time.perf_counter()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    records = sorted((r.to_dict() for r in result.records), key=lambda r: r["elapsed_s"])
    ends = [r["elapsed_s"] for r in records]
    engine = [float(r.get("duration_s") or 0.0) for r in records]
    slots = int(result.summary.get("slots") or 0) or CPUS
    steady = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")
    wall_per_trial = slots * steady
    engine_mean = statistics.fmean(engine)
    gaps = actor_gaps(records)
    gap_overhead = statistics.fmean(g["overhead_s"] for g in gaps) if gaps else float("nan")
    gap_engine = statistics.fmean(g["engine_s"] for g in gaps) if gaps else float("nan")
    return {
        "case": name,
        "trials": len(records),
        "slots": slots,
        "actors": len({r.get("worker_pid") for r in records}),
        "engine_s": round(engine_mean, 4),
        "engine_median_s": round(statistics.median(engine), 4),
        "wall_per_trial_s": round(wall_per_trial, 4),
        "overhead_s": round(wall_per_trial - engine_mean, 4),
        "actor_gaps": len(gaps),
        "actor_gap_overhead_s": round(gap_overhead, 4),
        "actor_gap_overhead_max_s": round(max((g["overhead_s"] for g in gaps), default=0.0), 4),
        "actor_gap_overhead_pct": round(100 * gap_overhead / gap_engine, 2),
        "startup_s": round(ends[0], 3),
        "search_wall_s": round(result.summary["wall_time_s"], 3),
        "total_wall_s": round(wall, 3),
        "max_trials_per_actor": max(int(r.get("actor_trials") or 0) for r in records),
        "failed": result.summary["n_failed"],
    }


def actor_gaps(records: list[dict]) -> list[dict]:
    """Per actor (``worker_pid``), consecutive trials: end-to-end gap minus engine time."""
    by_actor: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("worker_pid") is not None and r.get("ended_at") is not None:
            by_actor[r["worker_pid"]].append(r)
    gaps = []
    for trials in by_actor.values():
        trials.sort(key=lambda r: r["ended_at"])
        for prev, cur in zip(trials, trials[1:]):
            gap = cur["ended_at"] - prev["ended_at"]
            engine = float(cur.get("duration_s") or 0.0)
            gaps.append(
                {
                    "gap_s": gap,
                    "engine_s": engine,
                    "overhead_s": gap - engine,
                    "idle_s": cur["started_at"] - prev["ended_at"],
                }
            )
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--smoke", action="store_true", help="tiny cases only (tests)")
    parser.add_argument("--cpus", type=int, default=CPUS, help="Ray CPUs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("overhead", args)
    mode = "smoke" if args.smoke else ("quick" if args.quick else "full")
    counts = COUNTS[mode]
    cases = [c for c in CASES if c[0] in counts]
    if args.smoke:  # tiny evaluation sets: this checks the script, not the figures
        cases = [(name, 8, 200 if name == "0.1s" else 800) for name, _, _ in cases]
    init_ray(args.cpus)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="raysearch-bench-") as tmp:
            for name, channels, samples in cases:
                folder = Path(tmp) / name
                folder.mkdir()
                print(f"case {name}: {counts[name]} trials, CNN width {channels}, {samples} rows")
                rows.append(run_case(name, channels, samples, counts[name], folder))
    finally:
        shutdown_ray()
    for r in rows:
        r["target_met"] = bool(
            r["actor_gap_overhead_s"] < 0.1
            and (r["case"] != "1s" or r["actor_gap_overhead_pct"] < 5.0)
        )
    print_table(
        rows,
        [
            "case",
            "trials",
            "slots",
            "engine_s",
            "wall_per_trial_s",
            "overhead_s",
            "actor_gap_overhead_s",
            "actor_gap_overhead_pct",
            "startup_s",
            "total_wall_s",
            "target_met",
        ],
        title="per-trial overhead (targets: < 0.1 s per trial; < 5 % for 1 s trials)",
    )
    run.write({"mode": mode, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
