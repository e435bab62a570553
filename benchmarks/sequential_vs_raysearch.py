"""Benchmark: the same 24-setting grid run the sequential way and by raysearch, side by side.

The grid (conditional dialect; 24 settings): calibrate_method MinMax, Entropy, Percentile
99.99 and Percentile 99.999 (four calibration settings) x activation type QUInt8, QInt8 with
ActivationSymmetric false and QInt8 with ActivationSymmetric true x per_channel on/off;
weight_type QInt8; op_types_to_quantize [MatMul, Conv] on magika, [MatMul, Gemm] on the encoder
(the encoder has MatMul only). Metric ``cos`` for both.

Models: magika (``../shared/models/magika`` beside the repository, else the model that ships
in the package with data from the package's builder, see ``_common.magika_source``: 200
calibration rows, 500 evaluation rows, ``--quick`` 200) and a one-block transformer encoder
(``tests.models.make_encoder_model``: LayerNormalization, MatMul, Softmax, an int64 attention
mask; seq 64, dim 256, ffn 1024; 200 calibration rows, 1000 evaluation rows, ``--quick`` 500).

(a) sequential, the way existing tools do it: one setting after another, each a full
    ``onnxruntime.quantization.quantize_static`` call (calibration inference every time);
    the float model's outputs on the evaluation data are computed once and saved as ``.npy``,
    then loaded for every setting; the quantized model's outputs, ``cos`` and ``L2``. ONNX
    Runtime's default threads (every core). Timed from the float reference to the last metric.
(b) raysearch: ``AutoSearch(config).run()`` with ``search_algo: Grid``,
    ``resources.max_concurrent_trials`` = CPUs, ``cpu_per_trial: 1``. Timed from before
    ``AutoSearch(...)`` to after ``run()`` returns, with Ray *not* initialised before: Ray
    start-up, config validation, data loading and the float reference are all inside.

The *ideal* time is ``(one calibration per distinct calibration + every trial's quantization
and evaluation) / cores``, from raysearch's own ``results.parquet``: ``calibration_s`` of the
trials whose ``calib_cache_hit`` is false, plus every ``quantization_s`` and ``evaluation_s``.
The ideal ratio is (a) / ideal; the target is (a)/(b) >= 80 % of it. Note that these per-part
times are measured while two trials share two cores, and that raysearch's cache computes one
histogram for both Percentile values, so "one calibration per distinct calibration" is what
raysearch actually ran.

Run::

    python benchmarks/sequential_vs_raysearch.py            # 500 / 1000 evaluation rows
    python benchmarks/sequential_vs_raysearch.py --quick    # 200 / 500 evaluation rows
    python benchmarks/sequential_vs_raysearch.py --smoke    # tiny encoder only (tests)

Writes ``benchmarks/results/sequential_vs_raysearch.json``.
"""

from __future__ import annotations

import argparse
import math
import shutil
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
    ("Entropy", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]
#: (activation_type, ActivationSymmetric or None when not set)
ACTIVATIONS = [("QUInt8", None), ("QInt8", False), ("QInt8", True)]
PER_CHANNEL = [True, False]


def search_space(op_types: list[str]) -> dict[str, Any]:
    """The grid in raysearch's conditional dialect (24 settings)."""
    return {
        "calibrate_method": ["MinMax", "Entropy", "Percentile"],
        "percentile": {
            "only_if": {"calibrate_method": "Percentile"},
            "extra_options": {"CalibPercentile": [99.99, 99.999]},
        },
        "activation_type": ["QUInt8", "QInt8"],
        "symmetric": {
            "only_if": {"activation_type": "QInt8"},
            "extra_options": {"ActivationSymmetric": [False, True]},
        },
        "per_channel": PER_CHANNEL,
        "weight_type": ["QInt8"],
        "op_types_to_quantize": [op_types],
    }


def settings_list(op_types: list[str]) -> list[dict[str, Any]]:
    """The same 24 settings for the sequential loop."""
    return product_settings(CALIBRATIONS, ACTIVATIONS, PER_CHANNEL, op_types)


def prepare(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Model file, data files and the case's parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "magika":
        model = magika_model(folder)
        calib, evaluation = magika_arrays(200, args.magika_eval_rows)
        return {
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
        "model": model,
        "calib": encoder_arrays(200, seed=3, **size),
        "eval": encoder_arrays(args.encoder_eval_rows, seed=9, **size),
        "op_types": ["MatMul", "Gemm"],
        "tolerance": 0.9999,
        "batch_size": 50,
        "size": size or "default",
    }


def run_sequential(case: dict[str, Any], folder: Path) -> dict[str, Any]:
    from raysearch.data import DataSource

    model = case["model"]
    calib = DataSource.load(case["calib"], model, batch_size=case["batch_size"])
    evaluation = DataSource.load(case["eval"], model, batch_size=case["batch_size"])
    work = folder / "sequential"
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


def run_raysearch(case: dict[str, Any], folder: Path) -> dict[str, Any]:
    import ray

    from raysearch import AutoSearch

    calib_file = save_npz(folder / "calib.npz", case["calib"])
    eval_file = save_npz(folder / "eval.npz", case["eval"])
    config = {
        "model": str(case["model"]),
        "calibration_data": str(calib_file),
        "eval_data": str(eval_file),
        "batch_size": case["batch_size"],
        "search_space": search_space(case["op_types"]),
        "search_algo": "Grid",
        "metric": METRIC,
        "tolerance": case["tolerance"],
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": CPUS},
        "output_dir": str(folder / "raysearch_out"),
        # Every setting on every row, as the sequential loop does: the per-setting metrics
        # are compared (evaluation on growing subsets is partial_eval.py's).
        "early_stopping": False,
    }
    shutdown_ray()
    assert not ray.is_initialized()
    load_before = load_average()
    started = time.perf_counter()
    started_at = time.time()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    ended_at = time.time()
    load_after = load_average()
    table = result.results.to_pylist()
    by_trial = {r["trial_id"]: r for r in result.records}
    rows = []
    for row in table:
        record = by_trial.get(row["trial_id"], {})
        rows.append(
            {
                "trial_id": row["trial_id"],
                "status": row["status"],
                "error": row.get("error"),
                METRIC: row["metric"],
                "setting": record.get("settings"),
                "duration_s": row["duration_s"],
                "calibration_s": row["calibration_s"],
                "quantization_s": row["quantization_s"],
                "evaluation_s": row["evaluation_s"],
                "calib_cache_hit": row["calib_cache_hit"],
                "worker_pid": record.get("worker_pid"),
                "elapsed_s": record.get("elapsed_s"),
                "started_at": record.get("started_at"),
                "ended_at": record.get("ended_at"),
            }
        )
    shutdown_ray()
    return {
        "wall_s": wall,
        "search_started_at": started_at,
        "search_ended_at": ended_at,
        "summary": result.summary,
        "best_params": result.best_params,
        "best_metric": result.best_metric,
        "trials": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def compare(name: str, case: dict, a: dict, b: dict) -> dict[str, Any]:
    n = len(a["trials"])
    ok_b = [r for r in b["trials"] if r["status"] == "ok"]
    calibration_s = sum(r["calibration_s"] or 0.0 for r in ok_b if not r["calib_cache_hit"])
    quantization_s = sum(r["quantization_s"] or 0.0 for r in ok_b)
    evaluation_s = sum(r["evaluation_s"] or 0.0 for r in ok_b)
    ideal_s = (calibration_s + quantization_s + evaluation_s) / CPUS
    ratio = a["wall_s"] / b["wall_s"]
    ideal_ratio = a["wall_s"] / ideal_s if ideal_s > 0 else math.nan
    # Same best setting and metric?
    best_a = best_row(a["trials"], METRIC, higher=True)
    best_b = best_row(ok_b, METRIC, higher=True)
    seq_by_id = {setting_id(r["setting"]): r for r in a["trials"]}
    diffs = []
    unmatched = 0
    for r in ok_b:
        other = seq_by_id.get(setting_id(r["setting"] or {}))
        if other is None:
            unmatched += 1
            continue
        diffs.append(abs(other[METRIC] - r[METRIC]))
    # Ties: several settings can give the very same metric; the best setting counts as the
    # same when raysearch's best is one of the sequential loop's best (equal metric).
    tied = {
        setting_id(r["setting"]) for r in a["trials"] if abs(r[METRIC] - best_a[METRIC]) <= 1e-12
    }
    same_setting = setting_id(best_b["setting"]) in tied
    metric_diff = abs(best_a[METRIC] - best_b[METRIC])
    # Where raysearch's wall time went: before the first trial started (Ray, data, float
    # reference, actors), the trial phase (first start to last end), after the last trial.
    first_start = min(r["started_at"] for r in ok_b)
    last_end = max(r["ended_at"] for r in ok_b)
    trial_phase_s = last_end - first_start
    timeline = {
        "before_first_trial_s": round(first_start - b["search_started_at"], 2),
        "trial_phase_s": round(trial_phase_s, 2),
        "after_last_trial_s": round(b["search_ended_at"] - last_end, 2),
        "lock_wait_in_cache_hits_s": round(
            sum(r["calibration_s"] or 0.0 for r in ok_b if r["calib_cache_hit"]), 2
        ),
    }
    distinct_calibrations = len({calibration_id(r["setting"]) for r in a["trials"]})
    return {
        "model": name,
        "settings": n,
        "raysearch_trials": len(b["trials"]),
        "raysearch_failed": len(b["trials"]) - len(ok_b),
        "unmatched_settings": unmatched,
        "sequential_wall_s": round(a["wall_s"], 2),
        "raysearch_wall_s": round(b["wall_s"], 2),
        "raysearch_summary_wall_s": round(b["summary"].get("wall_time_s") or 0.0, 2),
        "ratio": round(ratio, 3),
        "sequential_trials_per_min": round(60 * n / a["wall_s"], 2),
        "raysearch_trials_per_min": round(60 * len(b["trials"]) / b["wall_s"], 2),
        "distinct_calibrations": distinct_calibrations,
        "raysearch_calibrations_run": sum(1 for r in ok_b if not r["calib_cache_hit"]),
        "ideal_parts_s": {
            "calibration_s(cache misses)": round(calibration_s, 3),
            "quantization_s": round(quantization_s, 3),
            "evaluation_s": round(evaluation_s, 3),
            "cores": CPUS,
        },
        "ideal_s": round(ideal_s, 3),
        "ideal_ratio": round(ideal_ratio, 3),
        "fraction_of_ideal": round(ratio / ideal_ratio, 3),
        "target_fraction_of_ideal": 0.8,
        "target_met": bool(ratio >= 0.8 * ideal_ratio),
        "raysearch_timeline": timeline,
        "trial_phase_fraction_of_ideal": round(ideal_s / trial_phase_s, 3),
        "sequential_time_in": {
            "quantize_static_s": round(sum(r["quantize_static_s"] for r in a["trials"]), 2),
            "float_reference_once_s": round(a["float_reference_once_s"], 2),
            "load_reference_npy_s": round(sum(r["float_reference_s"] for r in a["trials"]), 3),
            "evaluation_s": round(sum(r["evaluation_s"] for r in a["trials"]), 2),
        },
        "raysearch_engine_s": round(sum(r["duration_s"] or 0.0 for r in ok_b), 2),
        "best": {
            "same_setting": same_setting,
            "sequential_metric": best_a[METRIC],
            "raysearch_metric": best_b[METRIC],
            "raysearch_summary_metric": b["best_metric"],
            "metric_abs_diff": metric_diff,
            "sequential_tied_best": len(tied),
            "sequential_setting": best_a["setting"],
            "raysearch_setting": best_b["setting"],
        },
        "max_abs_metric_diff_per_setting": max(diffs) if diffs else None,
        "load_average": {
            "sequential": [a["load_average_before"], a["load_average_after"]],
            "raysearch": [b["load_average_before"], b["load_average_after"]],
        },
        "eval_rows": len(next(iter(case["eval"].values()))),
        "calib_rows": len(next(iter(case["calib"].values()))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer evaluation rows")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny encoder only, 100 evaluation rows (tests)"
    )
    parser.add_argument(
        "--models", default=None, help="comma-separated: magika,encoder (default both)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    models = (args.models or ("encoder" if args.smoke else "magika,encoder")).split(",")
    args.magika_eval_rows = 200 if args.quick or args.smoke else 500
    args.encoder_eval_rows = 100 if args.smoke else (500 if args.quick else 1000)
    run = Run("sequential_vs_raysearch", args)

    cases = []
    details = {}
    tmp = Path(tempfile.mkdtemp(prefix="raysearch-bench-seq-"))
    try:
        for name in models:
            folder = tmp / name
            case = prepare(name, folder, args)
            print(f"== {name}: {len(settings_list(case['op_types']))} settings")
            print("(a) sequential: quantize_static per setting, float reference from .npy")
            a = run_sequential(case, folder)
            print(f"    {a['wall_s']:.1f} s")
            print("(b) raysearch: AutoSearch, Grid, Ray start-up included")
            b = run_raysearch(case, folder)
            print(f"    {b['wall_s']:.1f} s")
            row = compare(name, case, a, b)
            cases.append(row)
            details[name] = {"sequential": a["trials"], "raysearch": b["trials"]}
    finally:
        shutdown_ray()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print_table(
        [{**r, **r["best"]} for r in cases],
        [
            "model",
            "settings",
            "sequential_wall_s",
            "raysearch_wall_s",
            "ratio",
            "ideal_ratio",
            "fraction_of_ideal",
            "trial_phase_fraction_of_ideal",
            "sequential_trials_per_min",
            "raysearch_trials_per_min",
            "same_setting",
            "metric_abs_diff",
        ],
        title=f"sequential loop vs raysearch ({CPUS} CPUs, metric {METRIC})",
    )
    for r in cases:
        print(
            f"{r['model']}: best {METRIC} sequential {r['best']['sequential_metric']:.6f} "
            f"raysearch {r['best']['raysearch_metric']:.6f}; ideal {r['ideal_s']:.1f} s "
            f"({r['ideal_parts_s']}); target >= 80 % of ideal: "
            f"{'met' if r['target_met'] else 'NOT met'}; load {r['load_average']}"
        )
        print(f"{r['model']}: raysearch timeline {r['raysearch_timeline']}")
    run.write({"metric": METRIC, "cases": cases, "trials": details}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
