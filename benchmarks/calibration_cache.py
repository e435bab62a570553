"""Benchmark: a 12-setting grid on magika, naive quantize_static loop vs TrialRunner + cache.

The grid: calibrate_method MinMax, Percentile 99.99 and Percentile 99.999 (three calibration
settings) x activation_type QUInt8/QInt8 x per_channel on/off, op_types_to_quantize
[MatMul, Conv], weight_type QInt8; 200 calibration rows, 500 evaluation rows.

(a) naive: for every setting, ``quantize_static`` (calibration inference every time), then the
    float model's outputs on the evaluation data (recomputed per setting, as naive tools do),
    the quantized model's outputs, and the metrics.
(b) raysearch: one ``TrialRunner`` in this process, sequentially: calibration shared through
    the ``CalibrationCache``, the float reference computed once.

Both use 2 intra-op threads. The *ideal* time is what (a) would take with one calibration per
distinct calibration setting and one float reference: the ``quantize_static`` time of the first
setting of each calibration setting, plus every quantized-model evaluation, plus one float
reference, all as measured in (a). The target is a ratio (a)/(b) of at least 90 % of
(a)/ideal. Results go to ``benchmarks/results/calibration_cache.json``.

Run:
    python benchmarks/calibration_cache.py            # 200 calibration, 500 evaluation rows
    python benchmarks/calibration_cache.py --quick    # 100 evaluation rows
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    MAGIKA,
    ROOT,
    calibration_id,
    machine_info,
    naive_loop,
    product_settings,
)

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import Evaluator, compute_metric, run_model  # noqa: E402
from raysearch.providers import make_session  # noqa: E402
from raysearch.trial import TrialRunner  # noqa: E402

THREADS = 2
CALIBRATIONS = [
    ("MinMax", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]


def grid() -> list[dict]:
    return product_settings(
        CALIBRATIONS, (("QUInt8", None), ("QInt8", None)), (True, False), ("MatMul", "Conv")
    )


def naive(model: Path, calib: DataSource, evaluation: DataSource, work: Path) -> dict:
    """(a): quantize_static + float reference + evaluation, per setting."""
    return naive_loop(model, grid(), calib, evaluation, work, threads=THREADS)


def cached(model: Path, calib: DataSource, evaluation: DataSource, work: Path) -> dict:
    """(b): TrialRunner with the calibration cache, sequentially in this process."""
    start = time.perf_counter()
    runner = TrialRunner(
        model,
        calib,
        evaluation,
        Evaluator("cos", tolerance=0.99),
        cache_dir=work / "cache",
        threads=THREADS,
        measure_latency=False,
    )
    t0 = time.perf_counter()
    reference = runner.float_reference
    float_reference_s = time.perf_counter() - t0
    rows = []
    check_s = 0.0
    with runner:
        for i, setting in enumerate(grid()):
            out = work / f"cached_{i}.onnx"
            result = runner.run(setting, out)
            if result.status != "ok":
                raise RuntimeError(f"trial {i} failed: {result.error}")
            # Cross-check L2 as well; timed separately and not counted in (b).
            t0 = time.perf_counter()
            quantized, _ = run_model(make_session(out, THREADS), evaluation)
            l2 = compute_metric("L2", quantized, reference.outputs)
            check_s += time.perf_counter() - t0
            rows.append({"setting": setting, **result.to_dict(), "cos": result.metric, "L2": l2})
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 evaluation rows instead of 500")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/calibration_cache.json"
    )
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's pre-processing hints
    if not (MAGIKA / "model.onnx").is_file():
        print(f"magika not found in {MAGIKA}; set RAYSEARCH_MAGIKA_DIR", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-"))
    try:
        model = work / "model.onnx"  # quantize_static writes next to its input: use a copy
        shutil.copyfile(MAGIKA / "model.onnx", model)
        with np.load(MAGIKA / "calib.npz", allow_pickle=False) as f:
            calib_rows = f["bytes"][:200]
        with np.load(MAGIKA / "eval.npz", allow_pickle=False) as f:
            eval_rows = f["bytes"][: 100 if args.quick else 500]
        calib = DataSource.load({"bytes": calib_rows}, model, batch_size=50)
        evaluation = DataSource.load({"bytes": eval_rows}, model, batch_size=100)
        print(f"magika: {len(calib)} calibration rows, {len(evaluation)} evaluation rows")

        print("(a) naive loop: quantize_static + float reference + evaluation per setting")
        a = naive(model, calib, evaluation, work)
        print("(b) raysearch TrialRunner with the calibration cache")
        b = cached(model, calib, evaluation, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    first_of_each = {}
    for row in a["trials"]:
        first_of_each.setdefault(calibration_id(row["setting"]), row["quantize_static_s"])
    ideal_s = (
        sum(first_of_each.values())
        + sum(row["evaluation_s"] for row in a["trials"])
        + a["trials"][0]["float_reference_s"]
    )
    ratio = a["wall_s"] / b["wall_s"]
    ideal_ratio = a["wall_s"] / ideal_s
    best_a = max(a["trials"], key=lambda r: r["cos"])
    best_b = max(b["trials"], key=lambda r: r["cos"])
    best_l2_a = min(a["trials"], key=lambda r: r["L2"])
    best_l2_b = min(b["trials"], key=lambda r: r["L2"])
    same_metrics = all(
        x["cos"] == y["cos"] and x["L2"] == y["L2"] for x, y in zip(a["trials"], b["trials"])
    )
    time_in = {
        "calibration_s": sum(r["calibration_s"] for r in b["trials"]),
        "quantization_s": sum(r["quantization_s"] for r in b["trials"]),
        "evaluation_s": sum(r["evaluation_s"] for r in b["trials"]),
        "float_reference_s": b["float_reference_s"],
    }
    summary = {
        "machine": {**machine_info(), "threads": THREADS, "onnxruntime": ort.__version__},
        "rows": {"calibration": len(calib_rows), "evaluation": len(eval_rows)},
        "n_settings": len(a["trials"]),
        "distinct_calibration_settings": len(first_of_each),
        "naive_wall_s": a["wall_s"],
        "naive_time_in": {
            "quantize_static_s": sum(r["quantize_static_s"] for r in a["trials"]),
            "float_reference_s": sum(r["float_reference_s"] for r in a["trials"]),
            "evaluation_s": sum(r["evaluation_s"] for r in a["trials"]),
        },
        "cached_wall_s": b["wall_s"],
        "cached_time_in": time_in,
        "cache_stats": b["cache_stats"],
        "ideal_s": ideal_s,
        "ratio": ratio,
        "ideal_ratio": ideal_ratio,
        "fraction_of_ideal": ratio / ideal_ratio,
        "same_metrics_every_setting": same_metrics,
        "best_cos": {"naive": best_a["cos"], "cached": best_b["cos"], "setting": best_b["setting"]},
        "best_L2": {"naive": best_l2_a["L2"], "cached": best_l2_b["L2"]},
        "naive": a["trials"],
        "cached": b["trials"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str))

    print()
    print(f"naive loop      {a['wall_s']:7.1f} s")
    print(
        f"raysearch cache {b['wall_s']:7.1f} s  (calibration {time_in['calibration_s']:.1f} s, "
        f"quantization {time_in['quantization_s']:.1f} s, evaluation "
        f"{time_in['evaluation_s']:.1f} s, float reference {time_in['float_reference_s']:.1f} s)"
    )
    print(f"ratio           {ratio:7.2f}x")
    print(f"ideal ratio     {ideal_ratio:7.2f}x  (ideal time {ideal_s:.1f} s)")
    print(f"of ideal        {100 * ratio / ideal_ratio:7.1f} %  (target >= 90 %)")
    print(f"best cos        naive {best_a['cos']:.6f}  cached {best_b['cos']:.6f}")
    print(f"best L2         naive {best_l2_a['L2']:.6f}  cached {best_l2_b['L2']:.6f}")
    print(f"identical metrics for every setting: {same_metrics}")
    print(f"written: {args.out}")
    ok = same_metrics and best_a["cos"] == best_b["cos"] and ratio >= 0.9 * ideal_ratio
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
