"""Benchmark: a 12-setting grid on magika, sequential quantize_static loop vs TrialRunner + cache.

The grid: calibrate_method MinMax, Percentile 99.99 and Percentile 99.999 (three calibration
settings) x activation_type QUInt8/QInt8 x per_channel on/off, op_types_to_quantize
[MatMul, Conv], weight_type QInt8; magika (``_common.magika_source``) with 200 calibration rows
and 500 evaluation rows (``--quick`` 100; ``--smoke``: 20 and 20 rows, QUInt8 only, 6 settings).

(a) sequential loop: for every setting, ``quantize_static`` (calibration inference every
    time), then the float model's outputs on the evaluation data (recomputed per setting, as
    naive tools do), the quantized model's outputs, and the metrics (``_common.naive_loop``).
(b) raysearch: one ``TrialRunner`` in this process, one setting after another: calibration
    shared through the ``CalibrationCache`` (both Percentile values share one histogram), the
    float reference computed once.

Both use 2 intra-op threads, in one process, one thing at a time.

The *ideal* is the work (b) cannot skip, as (b) itself measured it: the float reference once,
the calibrations it actually ran (cache misses), and every setting's quantization and
evaluation. These are disjoint intervals of (b)'s wall time, run one after another, so the
ideal is a lower bound of (b): ``fraction_of_ideal`` = ideal / (b) <= 100 %, and the ratio
(a)/(b) <= the ideal ratio (a)/ideal. What (b) spends beyond the ideal is its overhead
(session set-up, cache look-ups, file writes). The target is (a)/(b) >= 90 % of (a)/ideal.

Run::

    python benchmarks/calibration_cache.py            # 500 evaluation rows
    python benchmarks/calibration_cache.py --quick    # 100 evaluation rows
    python benchmarks/calibration_cache.py --smoke    # 20 rows, 6 settings (tests)

Writes ``benchmarks/results/calibration_cache.json`` (``.quick.json``, ``.smoke.json``; or
``--out``). Exits 1 when (a) and (b) disagree on any setting's metrics.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Run,
    calibration_id,
    magika_arrays,
    magika_model,
    naive_loop,
    print_table,
    product_settings,
    quiet,
)

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import Evaluator, compute_metric, run_model  # noqa: E402
from raysearch.providers import make_session  # noqa: E402
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec  # noqa: E402

THREADS = 2
TARGET = 0.9
CALIBRATIONS = [
    ("MinMax", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]


def grid(smoke: bool = False) -> list[dict]:
    """The 12 settings (6 with ``smoke``: QUInt8 only)."""
    activations = (("QUInt8", None),) if smoke else (("QUInt8", None), ("QInt8", None))
    return product_settings(CALIBRATIONS, activations, (True, False), ("MatMul", "Conv"))


def cached(
    model: Path, calib: DataSource, evaluation: DataSource, work: Path, settings: list[dict]
) -> dict[str, Any]:
    """(b): TrialRunner with the calibration cache, one setting after another."""
    start = time.perf_counter()
    runner = TrialRunner(
        TrialSpec(
            model,
            calib,
            evaluation,
            Evaluator("cos", tolerance=0.99),
            cache_dir=work / "cache",
            device=TrialDevice(threads=THREADS),
            measure_latency=False,
        )
    )
    t0 = time.perf_counter()
    reference = runner.float_reference
    float_reference_s = time.perf_counter() - t0
    rows = []
    check_s = 0.0
    with runner:
        for i, setting in enumerate(settings):
            out = work / f"cached_{i}.onnx"
            result = runner.run(setting, out)
            if result.status != "ok":
                raise RuntimeError(f"trial {i} failed: {result.error}")
            # Cross-check L2 as well; timed separately and not counted in (b).
            t0 = time.perf_counter()
            quantized, _ = run_model(make_session(out, THREADS), evaluation)
            l2 = compute_metric("L2", quantized, reference.outputs)
            check_s += time.perf_counter() - t0
            row = {k: v for k, v in result.to_dict().items() if k != "model_path"}
            rows.append({"setting": setting, **row, "cos": result.metric, "L2": l2})
            print(
                f"  cached {i:2d}  calib {result.calibration_s:6.2f}s  quant "
                f"{result.quantization_s:5.2f}s  eval {result.evaluation_s:5.2f}s  "
                f"cos {result.metric:.5f}  hit {result.calib_cache_hit}"
            )
    wall = time.perf_counter() - start
    return {
        "wall_s": wall - check_s,
        "l2_cross_check_s": check_s,
        "float_reference_s": float_reference_s,
        "cache_stats": runner.cache.stats,
        "trials": rows,
    }


def summarize(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Ratio, the ideal (a lower bound of (b), from (b)'s own parts) and the correctness
    checks: the same metrics for every setting, the same best setting."""
    misses = [r for r in b["trials"] if not r["calib_cache_hit"]]
    parts = {
        "float_reference_s": b["float_reference_s"],
        "calibration_s(cache misses)": sum(r["calibration_s"] for r in misses),
        "quantization_s": sum(r["quantization_s"] for r in b["trials"]),
        "evaluation_s": sum(r["evaluation_s"] for r in b["trials"]),
    }
    ideal_s = sum(parts.values())
    ratio = a["wall_s"] / b["wall_s"]
    ideal_ratio = a["wall_s"] / ideal_s
    best_a = max(a["trials"], key=lambda r: r["cos"])
    best_b = max(b["trials"], key=lambda r: r["cos"])
    diffs = [
        max(abs(x["cos"] - y["cos"]), abs(x["L2"] - y["L2"]))
        for x, y in zip(a["trials"], b["trials"], strict=True)
    ]
    return {
        "n_settings": len(a["trials"]),
        "distinct_calibration_settings": len({calibration_id(r["setting"]) for r in a["trials"]}),
        "calibrations_run": len(misses),
        "naive_wall_s": a["wall_s"],
        "naive_time_in": {
            "quantize_static_s": sum(r["quantize_static_s"] for r in a["trials"]),
            "float_reference_s": sum(r["float_reference_s"] for r in a["trials"]),
            "evaluation_s": sum(r["evaluation_s"] for r in a["trials"]),
        },
        "cached_wall_s": b["wall_s"],
        "cache_stats": b["cache_stats"],
        "ideal_parts_s": parts,
        "ideal_s": ideal_s,
        "ideal_is_bound": ideal_s <= b["wall_s"],
        "ratio": ratio,
        "ideal_ratio": ideal_ratio,
        "fraction_of_ideal": ideal_s / b["wall_s"],
        "target_fraction_of_ideal": TARGET,
        "target_met": ideal_s / b["wall_s"] >= TARGET,
        "max_abs_metric_diff_per_setting": max(diffs),
        "same_metrics_every_setting": max(diffs) == 0.0,
        "best_cos": {
            "naive": best_a["cos"],
            "cached": best_b["cos"],
            "same_setting": best_a["setting"] == best_b["setting"],
            "setting": best_b["setting"],
        },
        "best_L2": {
            "naive": min(r["L2"] for r in a["trials"]),
            "cached": min(r["L2"] for r in b["trials"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 evaluation rows instead of 500")
    parser.add_argument("--smoke", action="store_true", help="20 rows, 6 settings (tests)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()  # quantize_static's pre-processing hints
    run = Run("calibration_cache", args)
    calib_rows, eval_rows = (20, 20) if args.smoke else (200, 100 if args.quick else 500)
    settings = grid(args.smoke)

    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-cache-"))
    try:
        model = magika_model(work)  # quantize_static writes next to its input: use a copy
        calib_arrays, eval_arrays = magika_arrays(calib_rows, eval_rows)
        calib = DataSource.load(calib_arrays, model, batch_size=50)
        evaluation = DataSource.load(eval_arrays, model, batch_size=100)
        print(f"magika: {len(calib)} calibration rows, {len(evaluation)} evaluation rows")
        print("(a) naive loop: quantize_static + float reference + evaluation per setting")
        a = naive_loop(model, settings, calib, evaluation, work, threads=THREADS)
        print("(b) raysearch TrialRunner with the calibration cache")
        b = cached(model, calib, evaluation, work, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = summarize(a, b)
    print()
    print_table(
        [
            {"side": "(a) naive loop", "wall_s": a["wall_s"], **summary["naive_time_in"]},
            {"side": "(b) TrialRunner + cache", "wall_s": b["wall_s"], **summary["ideal_parts_s"]},
            {"side": "ideal (work of (b))", "wall_s": summary["ideal_s"]},
        ],
        [
            "side",
            "wall_s",
            "quantize_static_s",
            "float_reference_s",
            "calibration_s(cache misses)",
            "quantization_s",
            "evaluation_s",
        ],
        title=f"{summary['n_settings']} settings on magika, {THREADS} threads, one process",
    )
    print(f"ratio (a)/(b)       {summary['ratio']:7.2f}x")
    print(f"ideal ratio         {summary['ideal_ratio']:7.2f}x  (ideal {summary['ideal_s']:.1f} s)")
    print(
        f"of ideal            {100 * summary['fraction_of_ideal']:7.1f} %  "
        f"(target >= {100 * TARGET:.0f} %: {'met' if summary['target_met'] else 'NOT met'})"
    )
    print(
        f"calibrations        {summary['calibrations_run']} run for "
        f"{summary['distinct_calibration_settings']} calibration settings"
    )
    print(
        f"best cos            naive {summary['best_cos']['naive']:.6f}  "
        f"cached {summary['best_cos']['cached']:.6f}  "
        f"same setting: {summary['best_cos']['same_setting']}"
    )
    print(f"identical metrics for every setting: {summary['same_metrics_every_setting']}")
    run.write(
        {
            "threads": THREADS,
            "rows": {"calibration": len(calib), "evaluation": len(evaluation)},
            **summary,
            "naive": a["trials"],
            "cached": b["trials"],
        },
        args.out,
    )
    return 0 if summary["same_metrics_every_setting"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
