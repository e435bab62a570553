"""Benchmark: the same 12-setting grid run the sequential way and by raysearch's command.

The grid (conditional dialect; 12 settings): calibrate_method MinMax, Percentile 99.99 and
Percentile 99.999 (three calibration settings) x activation type QUInt8 / QInt8 x per_channel
on/off; weight_type QInt8; op_types_to_quantize [MatMul, Conv] on magika, [MatMul, Gemm] on the
encoder (the encoder has MatMul only). Metric ``cos``, no tolerance: like the loop, the search
looks for the setting of the highest cosine.

Models: magika (``../shared/models/magika`` beside the repository, else the model that ships
in the package with data from the package's builder, see ``_common.magika_source``: 200
calibration rows, 500 evaluation rows) and a one-block transformer encoder
(``tests.models.make_encoder_model``: LayerNormalization, MatMul, Softmax, an int64 attention
mask; seq 64, dim 256, ffn 1024; 200 calibration rows, 1000 evaluation rows).

(a) sequential, the way existing tools do it: one setting after another, each a full
    ``onnxruntime.quantization.quantize_static`` call (calibration inference every time);
    the float model's outputs on the evaluation data are computed once and saved as ``.npy``,
    then loaded for every setting; the quantized model's outputs, ``cos`` and ``L2``. ONNX
    Runtime's default threads (every core). Timed from the float reference to the last metric.
(b) raysearch as a user runs it: the command ``raysearch run config.yaml`` in a new process,
    with the config's defaults (``early_stopping`` on: each trial is evaluated on 10 %, 33 %
    and 100 % of the rows, and ASHA stops the settings outside the best third),
    ``search_algo: Grid``, ``resources.max_concurrent_trials`` = CPUs, ``cpu_per_trial: 1``.
    Timed from starting the process to its exit: Python's start, the imports, Ray's start and
    shutdown, config validation, data loading, the float reference and the outputs (summary,
    table, best model, plots, TensorBoard) are all inside.
(c) the same command with ``early_stopping: false`` (every setting on every row, as (a)):
    what the fixed cost and the calibration sharing alone give, and every setting's metric to
    compare with (a)'s.

The timeline of (b) and (c): ``before_first_trial_s`` (process start to the first trial's
start, actor clock), ``trial_phase_s`` and ``after_last_trial_s`` (last trial's end to the
process's exit); the issue's targets are at most 3 s and 1 s. ``ray_floor`` measures, in the
same run, what Ray alone takes on this machine: a new Python process that imports Ray,
``ray.init``s a local Ray, runs one actor's first method, and shuts Ray down.
``tune_floor``, what Ray Tune alone takes: a new process that imports Ray Tune, starts a local
Ray and runs a ``Tuner`` of two trials of a class ``Trainable`` that does nothing, with the
resources of (b) (one CPU per trial, actors reused), to the first trial's ``step``
(``to_first_trial_s``), and shuts Ray down with ``ray.shutdown`` (``shutdown_s``). A search on
Ray Tune cannot start its first trial sooner.

(a) and (b) run as ``--repeat`` alternating pairs (3 unless ``--smoke``): a single pair on a
shared machine moves by 20 % from run to run, and alternating puts a quieter or busier stretch
on both sides. ``ratio`` is the median pair's (a) / (b), whose figures are reported in full;
``repeats`` holds every pair's, ``ratio_min`` and ``ratio_max`` their spread. (c), the
floors and the ideal run once, (c) compared with the median pair's loop.

The *ideal* time is ``(one calibration per distinct calibration + every trial's quantization
and evaluation) / cores`` from (c)'s records. Target: the median (a) / (b) >= 3, with the same
best setting in every pair.

Run::

    python benchmarks/sequential_vs_raysearch.py            # magika and the encoder
    python benchmarks/sequential_vs_raysearch.py --quick    # magika only
    python benchmarks/sequential_vs_raysearch.py --smoke    # tiny encoder only (tests)
    python benchmarks/sequential_vs_raysearch.py --quick --repeat 5   # more pairs

Writes ``benchmarks/results/sequential_vs_raysearch.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    best_row,
    calibration_id,
    encoder_arrays,
    encoder_model,
    load_average,
    magika_arrays,
    magika_model,
    naive_loop,
    print_table,
    product_settings,
    quiet,
    save_npz,
    setting_id,
    shutdown_ray,
)

METRIC = "cos"
CALIBRATIONS = [
    ("MinMax", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]
#: (activation_type, ActivationSymmetric or None when not set)
ACTIVATIONS = [("QUInt8", None), ("QInt8", None)]
PER_CHANNEL = [True, False]


def search_space(op_types: list[str]) -> dict[str, Any]:
    """The grid in raysearch's conditional dialect (12 settings)."""
    return {
        "calibrate_method": ["MinMax", "Percentile"],
        "percentile": {
            "only_if": {"calibrate_method": "Percentile"},
            "extra_options": {"CalibPercentile": [99.99, 99.999]},
        },
        "activation_type": ["QUInt8", "QInt8"],
        "per_channel": PER_CHANNEL,
        "weight_type": ["QInt8"],
        "op_types_to_quantize": [op_types],
    }


def settings_list(op_types: list[str]) -> list[dict[str, Any]]:
    """The same 12 settings for the sequential loop."""
    return product_settings(CALIBRATIONS, ACTIVATIONS, PER_CHANNEL, op_types)


def prepare(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Model file, data files and the case's parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "magika":
        model = magika_model(folder)
        calib, evaluation = magika_arrays(200, args.magika_eval_rows)
        return {
            "name": name,
            "model": model,
            "calib": calib,
            "eval": evaluation,
            "op_types": ["MatMul", "Conv"],
            "tolerance": 0.99,
            "batch_size": 50,
        }
    size = {"seq": 8, "dim": 16, "ffn": 32} if args.smoke else {}
    model = encoder_model(folder, **size)
    return {
        "name": name,
        "model": model,
        "calib": encoder_arrays(200, seed=3, **size),
        "eval": encoder_arrays(args.encoder_eval_rows, seed=9, **size),
        "op_types": ["MatMul", "Gemm"],
        "tolerance": 0.9999,
        "batch_size": 50,
        "size": size or "default",
    }


def run_sequential(case: dict[str, Any], folder: Path, repeat: int = 0) -> dict[str, Any]:
    from raysearch.data import DataSource

    model = case["model"]
    calib = DataSource.load(case["calib"], model, batch_size=case["batch_size"])
    evaluation = DataSource.load(case["eval"], model, batch_size=case["batch_size"])
    work = folder / f"sequential_{repeat}"
    work.mkdir()
    load_before = load_average()
    result = naive_loop(
        model,
        settings_list(case["op_types"]),
        calib,
        evaluation,
        work,
        threads=CPUS,
        reference="npy",
        metrics=(METRIC, "L2"),
    )
    result["load_average_before"] = load_before
    result["load_average_after"] = load_average()
    return result


def run_raysearch(case: dict[str, Any], folder: Path, early_stopping: bool) -> dict[str, Any]:
    """``raysearch run config.yaml`` in a new process, timed from its start to its exit."""
    import json

    import yaml

    calib_file = folder / "calib.npz"
    eval_file = folder / "eval.npz"
    if not calib_file.exists():
        save_npz(calib_file, case["calib"])
        save_npz(eval_file, case["eval"])
    out = folder / ("raysearch_out" if early_stopping else "raysearch_every_row_out")
    config = {
        "model": str(case["model"]),
        "calibration_data": str(calib_file),
        "eval_data": str(eval_file),
        "batch_size": case["batch_size"],
        "search_space": search_space(case["op_types"]),
        "search_algo": "Grid",
        "metric": METRIC,
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": CPUS},
        "output_dir": str(out),
    }
    if not early_stopping:
        config["early_stopping"] = False
    config_file = folder / f"config_{'partial' if early_stopping else 'every_row'}.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "raysearch", "run", str(config_file), "--overwrite"]
    shutdown_ray()
    load_before = load_average()
    started = time.perf_counter()
    started_at = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    ended_at = time.time()
    load_after = load_average()
    if done.returncode != 0:
        raise RuntimeError(f"raysearch run failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    rows = []
    for record in records:
        rows.append(
            {
                "trial_id": record["trial_id"],
                "status": record["status"],
                "error": record.get("error"),
                METRIC: record["metric"],
                "setting": record.get("settings"),
                "duration_s": record.get("duration_s"),
                "calibration_s": record.get("calibration_s"),
                "quantization_s": record.get("quantization_s"),
                "evaluation_s": record.get("evaluation_s"),
                "calib_cache_hit": record.get("calib_cache_hit"),
                "eval_rows": record.get("eval_rows"),
                "stopped_at_rung": record.get("stopped_at_rung"),
                "worker_pid": record.get("worker_pid"),
                "started_at": record.get("started_at"),
                "ended_at": record.get("ended_at"),
            }
        )
    return {
        "wall_s": wall,
        "search_started_at": started_at,
        "search_ended_at": ended_at,
        "summary": summary,
        "best_params": summary.get("best_params"),
        "best_metric": summary.get("best_metric"),
        "trials": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def run_pairs(
    case: dict[str, Any], folder: Path, repeat: int
) -> tuple[list[tuple[dict, dict]], dict[str, Any]]:
    """``repeat`` alternating pairs of (a) and (b), so that a quieter or busier stretch of a
    shared machine falls on both sides (the figures are the median pair's), then (c) once."""
    print(f"== {case['name']}: {len(settings_list(case['op_types']))} settings")
    pairs = []
    for number in range(repeat):
        pair = f"pair {number + 1} of {repeat}"
        print(f"(a) sequential: quantize_static per setting, npy reference ({pair})")
        a = run_sequential(case, folder, number)
        print(f"    {a['wall_s']:.1f} s")
        print(f"(b) raysearch run (defaults: early stopping on), everything included ({pair})")
        b = run_raysearch(case, folder, early_stopping=True)
        print(f"    {b['wall_s']:.1f} s: {a['wall_s'] / b['wall_s']:.2f}x")
        pairs.append((a, b))
    print("(c) raysearch run, early_stopping: false")
    c = run_raysearch(case, folder, early_stopping=False)
    print(f"    {c['wall_s']:.1f} s")
    return pairs, c


_RAY_FLOOR = """
import time, sys
started = float(sys.argv[1])
import ray
ray.init(num_cpus=%d, include_dashboard=False, log_to_driver=False, logging_level=30)
initialised = time.time()
@ray.remote(num_cpus=1)
class Probe:
    def ping(self):
        return time.time()
first_call = ray.get(Probe.remote().ping.remote())
before_shutdown = time.time()
ray.shutdown()
print(initialised - started, first_call - started, time.time() - before_shutdown)
"""


_TUNE_FLOOR = """
import sys, tempfile, time
started = float(sys.argv[1])
import ray
from ray import tune
ray.init(num_cpus=%d, include_dashboard=False, log_to_driver=False, logging_level=30)
class Nothing(tune.Trainable):
    def step(self):
        return {"done": True, "at": time.time()}
    def reset_config(self, new_config):
        return True
with tempfile.TemporaryDirectory() as tmp:
    tuner = tune.Tuner(
        tune.with_resources(Nothing, {"cpu": 1}),
        tune_config=tune.TuneConfig(num_samples=2, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=tmp, verbose=0, log_to_file=False),
    )
    first = min(result.metrics["at"] for result in tuner.fit())
before_shutdown = time.time()
ray.shutdown()
print(first - started, time.time() - before_shutdown)
"""


def _timed_script(script: str, keys: tuple[str, ...], **env: str) -> dict[str, float]:
    """Run ``script`` (``%d`` in it: this machine's CPUs) in a new Python process, given the
    time it was started at; the numbers it prints last, rounded, under ``keys``."""
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", script % CPUS, repr(started)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    values = done.stdout.split()[-len(keys) :]
    return {key: round(float(value), 2) for key, value in zip(keys, values)}


def tune_floor() -> dict[str, float]:
    """What Ray Tune alone takes here (see the module docstring): to the first trial's step of
    a Tuner of two no-op trials, from a new process's start, and ``ray.shutdown``."""
    keys = ("to_first_trial_s", "shutdown_s")
    return _timed_script(_TUNE_FLOOR, keys, TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1")


def ray_floor() -> dict[str, float]:
    """What Ray alone takes here: a new process imports Ray, starts a local Ray, runs one
    actor's first method (``to_first_actor_call_s``, from the process's start) and shuts Ray
    down (``shutdown_s``). raysearch's fixed cost cannot go below it."""
    keys = ("to_ray_initialised_s", "to_first_actor_call_s", "shutdown_s")
    return _timed_script(_RAY_FLOOR, keys)


def _timeline(run: dict[str, Any]) -> dict[str, float]:
    """Where a raysearch command's wall time went (actor clocks for the trials)."""
    trials = [r for r in run["trials"] if r["started_at"] and r["ended_at"]]
    first_start = min(r["started_at"] for r in trials)
    last_end = max(r["ended_at"] for r in trials)
    return {
        "before_first_trial_s": round(first_start - run["search_started_at"], 2),
        "trial_phase_s": round(last_end - first_start, 2),
        "after_last_trial_s": round(run["search_ended_at"] - last_end, 2),
    }


def _whole(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials evaluated on every row (early stopping off, or not stopped)."""
    return [r for r in run["trials"] if r["status"] == "ok" and r["stopped_at_rung"] is None]


def _tied_best(a: dict[str, Any]) -> set[str]:
    """The loop's best settings: several settings can give the very same metric, and the best
    setting counts as the same when raysearch's best is one of them."""
    best = best_row(a["trials"], METRIC, higher=True)
    return {setting_id(r["setting"]) for r in a["trials"] if abs(r[METRIC] - best[METRIC]) <= 1e-12}


def _median_index(values: list[float]) -> int:
    """Index of the median of ``values`` (the lower of the two middle ones for an even
    count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def _against_loop(case: dict[str, Any], a: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A raysearch run's figures against the loop run ``a``."""
    best_a = best_row(a["trials"], METRIC, higher=True)
    seq_by_id = {setting_id(r["setting"]): r for r in a["trials"]}
    whole = _whole(run)
    best = best_row(whole, METRIC, higher=True)
    diffs = [
        abs(seq_by_id[setting_id(r["setting"])][METRIC] - r[METRIC])
        for r in whole
        if setting_id(r["setting"]) in seq_by_id
    ]
    rows = [r["eval_rows"] or 0 for r in run["trials"] if r["status"] == "ok"]
    return {
        "wall_s": round(run["wall_s"], 2),
        "ratio": round(a["wall_s"] / run["wall_s"], 3),
        "trials": len(run["trials"]),
        "failed": sum(1 for r in run["trials"] if r["status"] != "ok"),
        "stopped_early": sum(1 for r in run["trials"] if r["stopped_at_rung"] is not None),
        "eval_rows_run": sum(rows),
        "eval_rows_if_whole": len(run["trials"]) * len(next(iter(case["eval"].values()))),
        "calibrations_run": sum(
            1 for r in run["trials"] if r["status"] == "ok" and not r["calib_cache_hit"]
        ),
        "timeline": _timeline(run),
        "load_average": [run["load_average_before"], run["load_average_after"]],
        "same_setting": setting_id(best["setting"]) in _tied_best(a),
        "best_metric": best[METRIC],
        "summary_best_metric": run["best_metric"],
        "best_setting": best["setting"],
        "metric_abs_diff": abs(best_a[METRIC] - best[METRIC]),
        "max_abs_metric_diff_per_setting": max(diffs) if diffs else None,
        "settings_compared": len(diffs),
        "engine_s": round(sum(r["duration_s"] or 0.0 for r in run["trials"]), 2),
    }


def compare(name: str, case: dict, pairs: list[tuple[dict, dict]], c: dict) -> dict[str, Any]:
    """The median pair's figures in full, every pair's in ``repeats``, (c) against the median
    pair's loop."""
    runs = [_against_loop(case, a_i, b_i) for a_i, b_i in pairs]
    median = _median_index([run["ratio"] for run in runs])
    a = pairs[median][0]
    partial = runs[median]
    every_row = _against_loop(case, a, c)
    n = len(a["trials"])
    whole_c = _whole(c)
    calibration_s = sum(r["calibration_s"] or 0.0 for r in whole_c if not r["calib_cache_hit"])
    quantization_s = sum(r["quantization_s"] or 0.0 for r in whole_c)
    evaluation_s = sum(r["evaluation_s"] or 0.0 for r in whole_c)
    ideal_s = (calibration_s + quantization_s + evaluation_s) / CPUS
    best_a = best_row(a["trials"], METRIC, higher=True)
    repeats = [
        {
            "sequential_wall_s": round(a_i["wall_s"], 2),
            "raysearch_wall_s": run_i["wall_s"],
            "ratio": run_i["ratio"],
            "same_setting": run_i["same_setting"],
            "eval_rows_run": run_i["eval_rows_run"],
            "timeline": run_i["timeline"],
            "load_average_sequential": [a_i["load_average_before"], a_i["load_average_after"]],
            "load_average_raysearch": run_i["load_average"],
        }
        for (a_i, _), run_i in zip(pairs, runs)
    ]
    ratios = [r["ratio"] for r in repeats]
    return {
        "model": name,
        "settings": n,
        "sequential_wall_s": round(a["wall_s"], 2),
        "raysearch_wall_s": partial["wall_s"],
        # The median of the alternating pairs' ratios (the only pair's with --repeat 1).
        "ratio": partial["ratio"],
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "median_pair": median,
        "repeats": repeats,
        "target_ratio": 3.0,
        "target_met": bool(partial["ratio"] >= 3.0 and all(r["same_setting"] for r in repeats)),
        "raysearch": partial,
        "raysearch_every_row": every_row,
        "distinct_calibrations": len({calibration_id(r["setting"]) for r in a["trials"]}),
        "ideal_parts_s": {
            "calibration_s(cache misses)": round(calibration_s, 3),
            "quantization_s": round(quantization_s, 3),
            "evaluation_s": round(evaluation_s, 3),
            "cores": CPUS,
        },
        "ideal_s": round(ideal_s, 3),
        "ideal_ratio_every_row": round(a["wall_s"] / ideal_s, 3) if ideal_s > 0 else math.nan,
        "sequential_time_in": {
            "quantize_static_s": round(sum(r["quantize_static_s"] for r in a["trials"]), 2),
            "float_reference_once_s": round(a["float_reference_once_s"], 2),
            "load_reference_npy_s": round(sum(r["float_reference_s"] for r in a["trials"]), 3),
            "evaluation_s": round(sum(r["evaluation_s"] for r in a["trials"]), 2),
        },
        "sequential_best": {
            "metric": best_a[METRIC],
            "tied_best": len(_tied_best(a)),
            "setting": best_a["setting"],
        },
        "load_average_sequential": [a["load_average_before"], a["load_average_after"]],
        "eval_rows": len(next(iter(case["eval"].values()))),
        "calib_rows": len(next(iter(case["calib"].values()))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="magika only")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny encoder only, 100 evaluation rows (tests)"
    )
    parser.add_argument(
        "--models", default=None, help="comma-separated: magika,encoder (default both)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="alternating pairs of (a) and (b) per model (default 3; 1 with --smoke)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 3
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    quiet()
    default = "encoder" if args.smoke else ("magika" if args.quick else "magika,encoder")
    models = (args.models or default).split(",")
    args.magika_eval_rows = 500
    args.encoder_eval_rows = 100 if args.smoke else 1000
    run = Run("sequential_vs_raysearch", args)

    cases = []
    details = {}
    floors, tune_floors = [], []
    tmp = Path(tempfile.mkdtemp(prefix="raysearch-bench-seq-"))
    try:
        for name in models:
            folder = tmp / name
            case = prepare(name, folder, args)
            pairs, c = run_pairs(case, folder, args.repeat)
            floors.append(ray_floor())
            print(f"Ray alone: {floors[-1]}")
            tune_floors.append(tune_floor())
            print(f"Ray Tune alone: {tune_floors[-1]}")
            row = compare(name, case, pairs, c)
            cases.append(row)
            a, b = pairs[row["median_pair"]]
            details[name] = {
                "sequential": a["trials"],
                "raysearch": b["trials"],
                "every_row": c["trials"],
            }
    finally:
        shutdown_ray()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    table = []
    for r in cases:
        for label, part in (
            ("early stopping", r["raysearch"]),
            ("every row", r["raysearch_every_row"]),
        ):
            table.append(
                {
                    "model": r["model"],
                    "raysearch": label,
                    "sequential_wall_s": r["sequential_wall_s"],
                    **part,
                    **part["timeline"],
                }
            )
    print_table(
        table,
        [
            "model",
            "raysearch",
            "sequential_wall_s",
            "wall_s",
            "ratio",
            "before_first_trial_s",
            "trial_phase_s",
            "after_last_trial_s",
            "eval_rows_run",
            "stopped_early",
            "same_setting",
            "metric_abs_diff",
        ],
        title=f"sequential loop vs raysearch run ({CPUS} CPUs, metric {METRIC}, target ratio >= 3)",
    )
    for r in cases:
        print(
            f"{r['model']}: ratio {r['ratio']:.2f}x (median of {len(r['repeats'])} pairs: "
            f"{', '.join(format(p['ratio'], '.2f') for p in r['repeats'])}); "
            f"best {METRIC} sequential {r['sequential_best']['metric']:.6f} "
            f"raysearch {r['raysearch']['best_metric']:.6f}; target: "
            f"{'met' if r['target_met'] else 'NOT met'}; ideal (every row) {r['ideal_s']:.1f} s "
            f"({r['ideal_parts_s']}); load {r['raysearch']['load_average']}"
        )
    print(f"Ray alone (start to first actor call, shutdown): {floors}")
    print(f"Ray Tune alone (start to first trial, shutdown): {tune_floors}")
    report = {"metric": METRIC, "cases": cases, "ray_floor": floors, "tune_floor": tune_floors}
    run.write({**report, "trials": details}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
