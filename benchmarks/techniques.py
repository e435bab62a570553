"""Benchmark: what each quantization technique does to the metric, and what it costs.

For each model, every technique is applied on top of the same base settings (MatMul/Gemm/Conv,
per-channel weights; MinMax, and Percentile 99.999 with MatMul/Gemm/Conv outputs left float),
one trial each, in one process (:class:`raysearch.trial.TrialRunner`: the trial engine without
Ray, so that the numbers measure the technique and not the scheduling):

- ``none``: the base settings alone (the baseline in the same run);
- ``cle``: cross-layer equalization (``include_cle``);
- ``smooth_quant``: SmoothQuant, ``SmoothAlpha`` in 0.3, 0.5, 0.7, 0.9;
- ``bias_correction``: empirical bias correction;
- ``fast_finetune``: AdaRound and AdaQuant (``--finetune-iterations`` each);
- ``power_of_two``: power-of-two scales (``PowerOfTwoMethod`` NonOverflow, MinMSE; for NPUs:
  expected to cost accuracy, reported for its price);
- ``dynamic``: ``quant_mode: dynamic`` (per-channel and per-tensor; no base settings apply).

Per technique: its best metric over the bases and its own settings, the best metric without it
(``none``), and the mean seconds the technique itself took per trial (``<name>_s`` of the
trial's results; dynamic: quantization seconds).

Models (``--models``): ``magika`` (top-1 agreement with float, 500 rows), ``ppocr_rec`` (char
accuracy with the model's own evaluator) and ``encoder`` (cosine to float).

Run::

    python benchmarks/techniques.py
    python benchmarks/techniques.py --models encoder --finetune-iterations 50
    python benchmarks/techniques.py --models magika,ppocr_rec --techniques bias_correction

Writes ``benchmarks/results/techniques.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import ROOT, Run, encoder_arrays, encoder_model, print_table, quiet  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"
_WEIGHTED = ["MatMul", "Gemm", "Conv"]

BASES: list[dict[str, Any]] = [
    {
        "op_types_to_quantize": _WEIGHTED,
        "per_channel": True,
        "calibrate_method": "MinMax",
        "activation_type": "QUInt8",
    },
    {
        "op_types_to_quantize": _WEIGHTED,
        "per_channel": True,
        "calibrate_method": "Percentile",
        "activation_type": "QUInt8",
        "extra_options": {
            "CalibPercentile": 99.999,
            "OpTypesToExcludeOutputQuantization": _WEIGHTED,
        },
    },
]


def technique_settings(iterations: int) -> dict[str, list[dict[str, Any]]]:
    """Each technique's settings, merged into every base (``dynamic`` replaces the base)."""
    return {
        "none": [{}],
        "cle": [{"include_cle": True}],
        "smooth_quant": [
            {"include_sq": True, "extra_options": {"SmoothAlpha": a}} for a in (0.3, 0.5, 0.7, 0.9)
        ],
        "bias_correction": [{"include_bias_correction": True}],
        "fast_finetune": [
            {
                "include_fast_ft": True,
                "extra_options": {"OptimAlgorithm": a, "NumIterations": iterations, "DataSize": 16},
            }
            for a in ("adaround", "adaquant")
        ],
        "power_of_two": [
            {"extra_options": {"PowerOfTwoMethod": m, "ActivationSymmetric": True}}
            for m in ("NonOverflow", "MinMSE")
        ],
    }


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = {**base, **{k: v for k, v in extra.items() if k != "extra_options"}}
    options = {**base.get("extra_options", {}), **extra.get("extra_options", {})}
    if options:
        out["extra_options"] = options
    return out


def _model(name: str, work: Path) -> tuple[Path, dict[str, np.ndarray], Any, Any, int]:
    """Model path, calibration arrays, evaluation arrays (None: a custom evaluator reads its
    own), metric and calibration batch size."""
    if name == "magika":
        folder = SHARED / "magika"
        os.environ["RAYSEARCH_QUALITY_MAGIKA_EVAL"] = str(folder / "eval.npz")
        os.environ["RAYSEARCH_QUALITY_MAGIKA_MODEL"] = str(folder / "model.onnx")
        from _quality_evaluators import magika_top1

        with np.load(folder / "calib.npz") as data:
            calib = {"bytes": data["bytes"]}
        return folder / "model.onnx", calib, None, magika_top1, 50
    if name == "ppocr_rec":
        folder = SHARED / "ppocr_rec"
        sys.path.insert(0, str(folder))
        evaluator = importlib.import_module("evaluator")
        with np.load(folder / "calib.npz") as data:
            calib = {"x": data["x"]}
        return folder / "model.onnx", calib, None, evaluator.char_accuracy, 8
    path = encoder_model(work / "encoder")
    return path, encoder_arrays(64, seed=1), encoder_arrays(64, seed=2), "cos", 16


ALL_TECHNIQUES = (
    "none", "cle", "smooth_quant", "bias_correction", "fast_finetune", "power_of_two", "dynamic",
)  # fmt: skip


def run_model(
    name: str, work: Path, iterations: int, techniques: tuple[str, ...] = ALL_TECHNIQUES
) -> list[dict[str, Any]]:
    from raysearch.data import DataSource
    from raysearch.evaluate import Evaluator
    from raysearch.quantize.technique import registered_techniques
    from raysearch.trial import TrialDevice, TrialRunner, TrialSpec

    known = {cls.name for cls in registered_techniques()}
    path, calib, evaluation, metric, batch = _model(name, work)
    calibration = DataSource.load(calib, path, batch_size=batch, label="calibration data")
    evaluation = DataSource.load(evaluation, path, batch_size=16) if evaluation else None
    runner = TrialRunner(
        TrialSpec(
            path,
            calibration,
            evaluation,
            Evaluator(metric),
            cache_dir=work / f"cache-{name}",
            device=TrialDevice(threads=os.cpu_count() or 1),
        )
    )
    rows = []
    with runner:
        metrics: dict[str, list[float]] = {}
        seconds: dict[str, list[float]] = {}
        errors: dict[str, str] = {}
        plan = {
            t: [_merge(b, s) for b in BASES for s in settings]
            for t, settings in technique_settings(iterations).items()
            if (t == "none" or t in known) and t in techniques
        }
        if "dynamic" in techniques:
            plan["dynamic"] = [
                {"quant_mode": "dynamic", "per_channel": pc, "op_types_to_quantize": _WEIGHTED}
                for pc in (True, False)
            ]
        for technique, settings_list in plan.items():
            for i, settings in enumerate(settings_list):
                start = time.perf_counter()
                result = runner.run(settings, work / f"{name}-{technique}-{i}.onnx")
                wall = time.perf_counter() - start
                if result.status != "ok":
                    errors[technique] = str(result.error)
                    continue
                metrics.setdefault(technique, []).append(float(result.metric))
                spent = result.extra.get(f"{technique}_s")
                if technique == "dynamic":
                    spent = result.quantization_s
                if spent is not None:
                    seconds.setdefault(technique, []).append(float(spent))
                print(f"{name} {technique} {i}: {result.metric:.4f} ({wall:.1f} s)", flush=True)
    baseline = max(metrics.get("none", [float("nan")]))
    for technique in plan:
        values = metrics.get(technique, [])
        rows.append(
            {
                "model": name,
                "technique": technique,
                "trials": len(plan[technique]),
                "best_without": baseline,
                "best_with": max(values) if values else None,
                "gain": (max(values) - baseline) if values else None,
                "technique_s_per_trial": float(np.mean(seconds[technique]))
                if seconds.get(technique)
                else None,
                "failed": len(plan[technique]) - len(values),
                "error": errors.get(technique),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="magika,ppocr_rec,encoder")
    parser.add_argument("--finetune-iterations", type=int, default=200)
    parser.add_argument(
        "--techniques",
        default=",".join(ALL_TECHNIQUES),
        help="comma-separated, of "
        + ", ".join(ALL_TECHNIQUES)
        + " (none: the baseline, always run)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    techniques = tuple(dict.fromkeys(["none", *args.techniques.split(",")]))
    unknown = sorted(set(techniques) - set(ALL_TECHNIQUES))
    if unknown:
        parser.error(
            f"unknown technique(s) {', '.join(unknown)}: choose of {', '.join(ALL_TECHNIQUES)}"
        )
    quiet()
    run = Run("techniques", args)
    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-techniques-"))
    rows: list[dict[str, Any]] = []
    try:
        for name in args.models.split(","):
            model_rows = run_model(name, work, args.finetune_iterations, techniques)
            rows += model_rows
            print_table(
                model_rows, [c for c in model_rows[0] if c not in ("model", "error")], title=name
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run.write({"results": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
