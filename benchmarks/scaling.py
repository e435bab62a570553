"""Scaling: the same search with ``max_concurrent_trials`` 1, 2 (and more where more CPUs
exist), ``cpu_per_trial: 1`` (one ONNX Runtime intra-op thread per trial).

The search: a Grid over settings that share one MinMax calibration (so the trials are alike),
on the benchmark encoder (``tests.models.make_encoder_model``, seq 64, dim 256, ffn 1024;
200 calibration rows, 1500 evaluation rows: about 1 s per trial on one core). Ray is started
once, before the first search (its start-up is in neither figure); the searches then run one
after another, with the same trials, ``stop.iteration_limit`` = the number of trials.

- ``trial_phase_s``: from the first trial's start to the last trial's end (actor clocks): the
  time the trials took, scheduling included. ``speedup`` is this time at 1 concurrent trial
  divided by this time at N. Target: >= 1.7 at 2 on 2 cores.
- ``search_wall_s``: the whole ``AutoSearch(...).run()``, data loading and the float reference
  included (``end_to_end_speedup``).

Usage::

    python benchmarks/scaling.py            # 32 trials per search
    python benchmarks/scaling.py --quick    # 16 trials per search
    python benchmarks/scaling.py --smoke    # 4 tiny trials per search (tests)

Writes ``benchmarks/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    encoder_arrays,
    encoder_model,
    init_ray,
    load_average,
    one_calibration_space,
    print_table,
    quiet,
    save_npz,
    shutdown_ray,
)

from raysearch import AutoSearch  # noqa: E402

SPACE = one_calibration_space([["MatMul"]])


def levels(cpus: int) -> list[int]:
    out = [1]
    n = 2
    while n <= cpus:
        out.append(n)
        n *= 2
    if out[-1] != cpus:
        out.append(cpus)
    return out


def run_level(concurrency: int, data: dict, trials: int, folder: Path) -> dict:
    config = {
        "model": str(data["model"]),
        "calibration_data": str(data["calib"]),
        "eval_data": str(data["eval"]),
        "batch_size": 50,
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 1.0,
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": concurrency},
        "stop": {"iteration_limit": trials},
        "output_dir": str(folder / f"out_{concurrency}"),
        # Alike trials on every row (evaluation on growing subsets is partial_eval.py's).
        "early_stopping": False,
    }
    load_before = load_average()
    started = time.perf_counter()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    records = result.records
    phase = max(r["ended_at"] for r in records) - min(r["started_at"] for r in records)
    engine = [float(r.get("duration_s") or 0.0) for r in records]
    return {
        "concurrency": concurrency,
        "slots": result.summary.get("slots"),
        "trials": len(records),
        "failed": result.summary["n_failed"],
        "actors": len({r.get("worker_pid") for r in records}),
        "engine_mean_s": round(statistics.fmean(engine), 4),
        "engine_sum_s": round(sum(engine), 3),
        "trial_phase_s": round(phase, 3),
        "search_wall_s": round(wall, 3),
        "trials_per_min": round(60 * len(records) / phase, 2),
        "load_average": [load_before, load_average()],
    }


def _plain_worker(args: tuple) -> float:
    """``n`` trials with a TrialRunner in a plain process (no Ray); returns the wall time."""
    model, calib, evaluation, n, folder = args
    from raysearch.data import DataSource
    from raysearch.evaluate import Evaluator
    from raysearch.trial import TrialRunner

    calib_data = DataSource.load(calib, model, batch_size=50)
    eval_data = DataSource.load(evaluation, model, batch_size=50)
    runner = TrialRunner(
        model, calib_data, eval_data, Evaluator("L2", 1.0), cache_dir=folder, threads=1
    )
    runner.float_reference  # noqa: B018 - computed before the clock starts
    runner.run(
        {"calibrate_method": "MinMax", "op_types_to_quantize": ["MatMul"]}, Path(folder) / "w.onnx"
    )
    started = time.perf_counter()
    for i in range(n):
        setting = {
            "calibrate_method": "MinMax",
            "op_types_to_quantize": ["MatMul"],
            "per_channel": bool(i % 2),
        }
        runner.run(setting, Path(folder) / f"t{os.getpid()}_{i}.onnx")
    return time.perf_counter() - started


def machine_speedup(data: dict, n: int, folder: Path) -> dict:
    """The speed-up the machine itself gives without Ray: ``n`` trials in one plain process,
    then ``n`` trials in each of two plain processes at once (one intra-op thread each)."""
    import multiprocessing

    (folder / "plain").mkdir(exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    job = (str(data["model"]), str(data["calib"]), str(data["eval"]), n, str(folder / "plain"))
    with ctx.Pool(1) as pool:
        one = pool.map(_plain_worker, [job])[0]
    with ctx.Pool(2) as pool:
        two = max(pool.map(_plain_worker, [job, job]))
    return {
        "trials_per_process": n,
        "one_process_s": round(one, 3),
        "two_processes_s": round(two, 3),
        "speedup": round(2 * one / two, 3),
        "load_average": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 trials per search")
    parser.add_argument("--smoke", action="store_true", help="4 tiny trials per search (tests)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the plain-process (no Ray) baseline"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("scaling", args)
    trials = args.trials or (4 if args.smoke else (16 if args.quick else 32))
    size = {"seq": 8, "dim": 16, "ffn": 32} if args.smoke else {}
    eval_rows = 200 if args.smoke else 1500
    rows = []
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-scaling-") as tmp:
        folder = Path(tmp)
        data = {
            "model": encoder_model(folder, **size),
            "calib": save_npz(folder / "calib.npz", encoder_arrays(200, seed=3, **size)),
            "eval": save_npz(folder / "eval.npz", encoder_arrays(eval_rows, seed=9, **size)),
        }
        plain = None
        if CPUS >= 2 and not args.no_baseline:
            print("baseline: the same trials in 1 and 2 plain processes, no Ray")
            plain = machine_speedup(data, 2 if args.smoke else 6, folder)
            print(f"    {plain}")
        init_ray(CPUS)
        try:
            for concurrency in levels(CPUS):
                print(f"max_concurrent_trials {concurrency}: {trials} trials")
                rows.append(run_level(concurrency, data, trials, folder))
        finally:
            shutdown_ray()
    base = rows[0]
    for r in rows:
        r["speedup"] = round(base["trial_phase_s"] / r["trial_phase_s"], 3)
        r["end_to_end_speedup"] = round(base["search_wall_s"] / r["search_wall_s"], 3)
        r["efficiency"] = round(r["speedup"] / r["concurrency"], 3)
    two = next((r for r in rows if r["concurrency"] == 2), None)
    target = {
        "speedup_at_2": two["speedup"] if two else None,
        "target": 1.7,
        "met": bool(two and two["speedup"] >= 1.7),
    }
    print_table(
        rows,
        [
            "concurrency",
            "trials",
            "actors",
            "engine_mean_s",
            "trial_phase_s",
            "search_wall_s",
            "trials_per_min",
            "speedup",
            "end_to_end_speedup",
            "efficiency",
        ],
        title=f"scaling on {CPUS} CPUs, cpu_per_trial 1 (target: speed-up >= 1.7 at 2)",
    )
    print(f"target: {target}")
    if plain:
        print(f"the machine without Ray (2 plain processes vs 1): speed-up {plain['speedup']}")
    run.write(
        {
            "trials_per_search": trials,
            "eval_rows": eval_rows,
            "rows": rows,
            "plain_processes": plain,
            **target,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
