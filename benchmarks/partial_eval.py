"""Benchmark: evaluation on growing subsets (``early_stopping``) against evaluating every trial
on every row: the same Grid, the same seed, in one process.

For each model the same Grid runs twice, one search after the other with Ray started once
before both: (a) ``early_stopping: false``, every trial on every evaluation row; (b) the
default (rungs 10 %, 33 %, 100 % of the rows, ASHA keeping the best third at each). Metric
``cos``, no tolerance unless ``--tolerance`` (then candidates are decided and protected too),
``max_concurrent_trials`` = CPUs, ``cpu_per_trial: 1``.

- magika (``../shared/models/magika``, else the packaged copy, see ``_common.magika_source``):
  200 calibration rows, 500 evaluation rows; 256 settings: ``_common.one_calibration_space``
  (64 settings sharing one MinMax calibration) x op_types_to_quantize [MatMul, Conv], [MatMul],
  [Conv], every op.
- the benchmark encoder (``_common.encoder_model``: seq 64, dim 256, ffn 1024): 200
  calibration rows, 1500 evaluation rows; 256 settings: the same 64 x calibrate_method MinMax,
  Percentile 99.999 x op_types_to_quantize [MatMul], every op.

Reported per model and run: the evaluation rows the trials ran (``results.parquet``'s
``eval_rows`` summed; the float reference, computed once per search, is the same in both and
left out), the search's wall time (``AutoSearch(...).run()``), the trials' evaluation and
quantization seconds, the best metric and setting, the trials stopped at a rung. The claims:
rows cut at least 3x, wall time at least 2x, the best metric within 1e-4 of the whole
evaluation's (or the same setting); and, checked setting by setting, every trial (b) evaluated
on every row has exactly the metric (a) gives it.

Run::

    python benchmarks/partial_eval.py            # magika and the encoder, 256 settings each
    python benchmarks/partial_eval.py --smoke    # a tiny encoder, 16 settings (tests)

Writes ``benchmarks/results/partial_eval.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    encoder_arrays,
    encoder_model,
    init_ray,
    load_average,
    magika_arrays,
    magika_model,
    one_calibration_space,
    print_table,
    quiet,
    save_npz,
    shutdown_ray,
)

from raysearch import AutoSearch  # noqa: E402

METRIC = "cos"
SEED = 0
ROWS_TARGET, WALL_TARGET, METRIC_TARGET = 3.0, 2.0, 1e-4

#: The smoke run's 16 settings (one calibration): what decides quantization, not calibration.
SMOKE_SPACE: dict[str, Any] = {
    "calibrate_method": ["MinMax"],
    "op_types_to_quantize": [["MatMul"]],
    "activation_type": ["QUInt8", "QInt8"],
    "per_channel": [True, False],
    "reduce_range": [False, True],
    "extra_options": {"ActivationSymmetric": [False, True]},
}


def encoder_space() -> dict[str, Any]:
    space = one_calibration_space([["MatMul"], None])
    space["calibrate_method"] = ["MinMax", "Percentile"]
    space["percentile"] = {
        "only_if": {"calibrate_method": "Percentile"},
        "extra_options": {"CalibPercentile": [99.999]},
    }
    return space


def prepare(name: str, folder: Path, smoke: bool) -> dict[str, Any]:
    """The model, its data files and its Grid."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "magika":
        calib, evaluation = magika_arrays(200, 500)
        model = magika_model(folder)
        space = one_calibration_space([["MatMul", "Conv"], ["MatMul"], ["Conv"], None])
        batch = 50
    else:
        size = {"seq": 8, "dim": 16, "ffn": 32} if smoke else {}
        model = encoder_model(folder, **size)
        calib = encoder_arrays(64 if smoke else 200, seed=3, **size)
        evaluation = encoder_arrays(400 if smoke else 1500, seed=9, **size)
        space = SMOKE_SPACE if smoke else encoder_space()
        batch = 50
    return {
        "model": model,
        "calib": save_npz(folder / "calib.npz", calib),
        "eval": save_npz(folder / "eval.npz", evaluation),
        "eval_rows": len(next(iter(evaluation.values()))),
        "space": space,
        "batch_size": batch,
    }


def run_search(case: dict[str, Any], out: Path, early_stopping: bool, tolerance: float | None):
    config = {
        "model": str(case["model"]),
        "calibration_data": str(case["calib"]),
        "eval_data": str(case["eval"]),
        "batch_size": case["batch_size"],
        "search_space": case["space"],
        "search_algo": "Grid",
        "seed": SEED,
        "metric": METRIC,
        "tolerance": tolerance,
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": CPUS},
        "output_dir": str(out),
    }
    if not early_stopping:
        config["early_stopping"] = False
    load_before = load_average()
    started = time.perf_counter()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    rows = result.results.to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    return {
        "early_stopping": early_stopping,
        "wall_s": round(wall, 3),
        "trials": len(rows),
        "failed": len(rows) - len(ok),
        "stopped": sum(1 for r in ok if r["stopped_at_rung"] is not None),
        "candidates": result.summary["n_candidates"],
        "rows_evaluated": sum(int(r["eval_rows"] or 0) for r in ok),
        "evaluation_s": round(sum(r["evaluation_s"] or 0.0 for r in ok), 3),
        "quantization_s": round(sum(r["quantization_s"] or 0.0 for r in ok), 3),
        "calibration_s": round(sum(r["calibration_s"] or 0.0 for r in ok), 3),
        "best_metric": result.best_metric,
        "best_params": result.best_params,
        "summary_early_stopping": result.summary.get("early_stopping"),
        "load_average": [load_before, load_average()],
        "per_trial": [
            {
                "params": {k[7:]: v for k, v in r.items() if k.startswith("params/")},
                "status": r["status"],
                "metric": r["metric"],
                "eval_rows": r["eval_rows"],
                "stopped_at_rung": r["stopped_at_rung"],
                "is_candidate": r["is_candidate"],
                "duration_s": r["duration_s"],
            }
            for r in rows
        ],
    }


def _key(params: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in params.items() if v is not None}, sort_keys=True)


def compare(name: str, case: dict[str, Any], whole: dict, partial: dict) -> dict[str, Any]:
    full_by = {_key(t["params"]): t for t in whole["per_trial"]}
    mismatched, unmatched = [], 0
    for trial in partial["per_trial"]:
        other = full_by.get(_key(trial["params"]))
        if other is None:
            unmatched += 1
        elif trial["status"] == "ok" and trial["stopped_at_rung"] is None:
            if trial["metric"] != other["metric"]:
                mismatched.append([trial["params"], other["metric"], trial["metric"]])
    rows_ratio = whole["rows_evaluated"] / max(1, partial["rows_evaluated"])
    wall_ratio = whole["wall_s"] / partial["wall_s"]
    diff = abs((whole["best_metric"] or 0.0) - (partial["best_metric"] or 0.0))
    same = whole["best_params"] == partial["best_params"]
    return {
        "model": name,
        "settings": whole["trials"],
        "eval_rows": case["eval_rows"],
        "rows_whole": whole["rows_evaluated"],
        "rows_partial": partial["rows_evaluated"],
        "rows_ratio": round(rows_ratio, 3),
        "wall_whole_s": whole["wall_s"],
        "wall_partial_s": partial["wall_s"],
        "wall_ratio": round(wall_ratio, 3),
        "stopped": partial["stopped"],
        "best_whole": whole["best_metric"],
        "best_partial": partial["best_metric"],
        "best_abs_diff": diff,
        "same_best_setting": same,
        "candidates_whole": whole["candidates"],
        "candidates_partial": partial["candidates"],
        "unmatched_settings": unmatched,
        "metric_mismatches_when_whole": mismatched,
        "targets": {
            "rows_cut_3x": rows_ratio >= ROWS_TARGET,
            "wall_2x": wall_ratio >= WALL_TARGET,
            "best_within_1e-4_or_same": diff <= METRIC_TARGET or same,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny encoder, 16 settings")
    parser.add_argument("--models", default="magika,encoder")
    parser.add_argument("--tolerance", type=float, default=None, help="cos tolerance")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("partial_eval", args)
    models = ["encoder"] if args.smoke else [m for m in args.models.split(",") if m]
    cases, runs = [], {}
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-partial-") as tmp:
        init_ray(CPUS)
        try:
            for name in models:
                case = prepare(name, Path(tmp) / name, args.smoke)
                print(f"{name}: {case['eval_rows']} evaluation rows")
                whole = run_search(case, Path(tmp) / name / "whole", False, args.tolerance)
                print(f"  every row:       {whole['wall_s']:8.1f} s, best {whole['best_metric']}")
                partial = run_search(case, Path(tmp) / name / "partial", True, args.tolerance)
                print(
                    f"  growing subsets: {partial['wall_s']:8.1f} s, best {partial['best_metric']}"
                )
                cases.append(compare(name, case, whole, partial))
                runs[name] = {"whole": whole, "partial": partial}
        finally:
            shutdown_ray()
    print_table(
        cases,
        [
            "model",
            "settings",
            "rows_whole",
            "rows_partial",
            "rows_ratio",
            "wall_whole_s",
            "wall_partial_s",
            "wall_ratio",
            "stopped",
            "best_whole",
            "best_partial",
            "same_best_setting",
        ],
        title="\nevaluation on growing subsets vs every row (same Grid, same seed)",
    )
    for case in cases:
        print(f"{case['model']}: targets {case['targets']}")
    payload = {
        "metric": METRIC,
        "seed": SEED,
        "tolerance": args.tolerance,
        "cases": cases,
        "runs": runs,
    }
    run.write(payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
