"""Benchmark: the quality a search reaches with the A8W8_SEARCH preset (mixed precision and
output quantization included), TPE, at most 30 trials, 2 at a time, on real models.

Models (``--models``):

- ``magika`` (``../shared/models/magika``): top-1 agreement with the float model on its 500
  evaluation rows (a custom evaluator, ``_quality_evaluators.magika_top1``).
- ``ppocr_rec`` (``../shared/models/ppocr_rec``): char accuracy with the model's own evaluator
  (``evaluator:char_accuracy``, float 0.991).
- ``encoder``: the benchmark encoder (``_common.encoder_model``), cosine to float.

For each: the search's best (the most quantized setting within the tolerance, else the best
metric; ``raysearch.outputs.better``), the highest metric of any trial, the best among the
same search's settings that promote nothing, switch no technique on and quantize every
MatMul/Gemm/Conv (plain ONNX Runtime settings, the baseline in the same run), the best of any
setting that quantizes every MatMul/Gemm/Conv, tensors promoted, the share of
MatMul/Gemm/Conv nodes left quantized in the best model, and its latency against float (the
trial engine's ``latency_vs_float``: both models timed the same way). The tolerance is the
target: magika 0.998 top-1 agreement, ppocr_rec 0.981 char accuracy, encoder cosine 0.999.

Run::

    python benchmarks/quality.py                          # all three, 30 trials each
    python benchmarks/quality.py --models magika --trials 10
    python benchmarks/quality.py --spaces A8W8_SEARCH,NNCF,AUTO_INT8_SEARCH --anchors

``--spaces``: the searches per model, ONNX Runtime only (``A8W8_SEARCH``, the default), NNCF
only (``NNCF``: the ``nncf`` group of ``AUTO_INT8_SEARCH``) and both (``AUTO_INT8_SEARCH``);
``--anchors``: NNCF's one shot and ``quantize_with_accuracy_control`` in the same run
(``_quality_anchors.py``), scored by the same evaluator.

Writes ``benchmarks/results/quality.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import ROOT, Run, encoder_arrays, encoder_model, print_table, quiet  # noqa: E402

SHARED = ROOT.parent / "shared" / "models"


def _configs(
    work: Path, trials: int, concurrent: int = 2, gpu_per_trial: float = 0.0
) -> dict[str, dict[str, Any]]:
    resources = {"cpu_per_trial": 1, "max_concurrent_trials": concurrent}
    if gpu_per_trial:
        resources["gpu_per_trial"] = gpu_per_trial
    common = {
        "search_space": "A8W8_SEARCH",
        "search_algo": "TPE",
        "seed": 0,
        "stop": {"iteration_limit": trials},
        "resources": resources,
    }
    magika = SHARED / "magika"
    ppocr = SHARED / "ppocr_rec"
    encoder = encoder_model(work / "encoder")
    np.savez(work / "encoder_calib.npz", **encoder_arrays(64, seed=1))
    np.savez(work / "encoder_eval.npz", **encoder_arrays(64, seed=2))
    return {
        "magika": {
            **common,
            "model": str(magika / "model.onnx"),
            "calibration_data": str(magika / "calib.npz"),
            "metric": "_quality_evaluators:magika_top1",
            "higher_is_better": True,
            "tolerance": 0.002,
            "tolerance_mode": "absolute",
        },
        "ppocr_rec": {
            **common,
            "model": str(ppocr / "model.onnx"),
            "calibration_data": str(ppocr / "calib.npz"),
            "batch_size": 8,
            "metric": "evaluator:char_accuracy",
            "higher_is_better": True,
            "tolerance": 0.01,
            "tolerance_mode": "absolute",
        },
        "encoder": {
            **common,
            "model": str(encoder),
            "calibration_data": str(work / "encoder_calib.npz"),
            "eval_data": str(work / "encoder_eval.npz"),
            "metric": "cos",
            "tolerance": 0.999,
        },
    }


def _promoted(row: dict[str, Any]) -> float:
    value = row.get("extra/promoted")
    return float(value) if value is not None else 0.0


def _nncf_only() -> dict[str, Any]:
    """NNCF's settings of ``AUTO_INT8_SEARCH`` (its ``nncf`` group), NNCF alone, starting from
    the same NNCF start point."""
    import yaml

    preset = yaml.safe_load((ROOT / "configs" / "AUTO_INT8_SEARCH.yaml").read_text())
    group = dict(preset["search_space"]["nncf"])
    group.pop("only_if")
    starts = [p for p in preset.get("points_to_evaluate", []) if p.get("quantizer") == "nncf"]
    return {"search_space": {"quantizer": "nncf", **group}, "points_to_evaluate": starts}


#: What ``--spaces`` names: ONNX Runtime only, NNCF only, both (issue 15's three searches),
#: as the config keys each sets.
SPACES = {
    "A8W8_SEARCH": lambda: {"search_space": "A8W8_SEARCH"},
    "NNCF": _nncf_only,
    "AUTO_INT8_SEARCH": lambda: {"search_space": "AUTO_INT8_SEARCH"},
}


def run_one(
    name: str, config: dict[str, Any], work: Path, space: str = "A8W8_SEARCH"
) -> dict[str, Any]:
    from raysearch.outputs import best_record
    from raysearch.search import AutoSearch

    folder = work / f"out-{name}-{space}"
    config = {**config, **SPACES[space](), "output_dir": str(folder)}
    result = AutoSearch(config).run()
    rows = [r for r in result.results.to_pylist() if r["status"] == "ok"]
    # The search's own choice: the most quantized candidate, else the best metric.
    chosen = best_record(result.records, higher_is_better=True)
    best = next(r for r in rows if r["trial_id"] == chosen.trial_id)
    quantized = [r for r in rows if (r.get("extra/quantized_share") or 0.0) == 1.0]
    # Plain ONNX Runtime: every weighted node quantized, nothing promoted, no technique.
    plain = [
        r["metric"]
        for r in quantized
        if _promoted(r) == 0
        and (r.get("quantizer") or "ort") == "ort"
        and not any(v is True for k, v in r.items() if k.startswith("params/include_"))
    ]
    return {
        "model": name,
        "space": space,
        "best_quantizer": best.get("quantizer") or "ort",
        "trials": len(result.results),
        "float": result.summary.get("float_metric"),
        "best": best["metric"],
        "is_candidate": best["is_candidate"],
        "candidates": sum(bool(r["is_candidate"]) for r in rows),
        "highest_metric": max(r["metric"] for r in rows),
        "best_plain_ort": max(plain) if plain else None,
        "best_fully_quantized": max((r["metric"] for r in quantized), default=None),
        "fully_quantized_candidates": sum(bool(r["is_candidate"]) for r in quantized),
        "promoted": _promoted(best),
        "weighted_nodes_quantized": best.get("extra/quantized_share"),
        "latency_vs_float": best.get("extra/latency_vs_float"),
        "best_params": {k[7:]: v for k, v in best.items() if k.startswith("params/")},
        "wall_s": result.summary.get("wall_time_s"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="magika,ppocr_rec,encoder")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--spaces", default="A8W8_SEARCH", help=f"comma-separated, of {', '.join(SPACES)}"
    )
    parser.add_argument(
        "--anchors", action="store_true", help="NNCF's one shot and accuracy control too"
    )
    parser.add_argument("--concurrent", type=int, default=2, help="trials at a time")
    parser.add_argument(
        "--gpu-per-trial", type=float, default=0.0, help="GPU share of each trial (0: CPU)"
    )
    args = parser.parse_args(argv)
    quiet()
    import ray

    run = Run("quality", args)
    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-quality-"))
    start_ray()
    rows: list[dict[str, Any]] = []
    anchored: list[dict[str, Any]] = []
    try:
        configs = _configs(work, args.trials, args.concurrent, args.gpu_per_trial)
        for name in args.models.split(","):
            if args.anchors:
                from _quality_anchors import anchors

                anchored += anchors(name, configs[name], work, SHARED)
                print_table(anchored[-2:], list(anchored[-1]), title=f"{name}: NNCF anchors")
            for space in args.spaces.split(","):
                rows.append(run_one(name, configs[name], work, space))
                print_table(rows[-1:], list(rows[-1])[:-2], title=f"{name}: {space}")
                # Each search's figures kept as they come.
                run.write({"results": rows, "anchors": anchored}, args.out)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


_ENV = ("RAYSEARCH_QUALITY_MAGIKA_EVAL", "RAYSEARCH_QUALITY_MAGIKA_MODEL")


def start_ray() -> None:
    """A local Ray whose workers find the models' evaluators: magika's paths in the
    environment, this folder and ppocr_rec's on ``PYTHONPATH`` (here too)."""
    import ray

    magika = SHARED / "magika"
    os.environ["RAYSEARCH_QUALITY_MAGIKA_EVAL"] = str(magika / "eval.npz")
    os.environ["RAYSEARCH_QUALITY_MAGIKA_MODEL"] = str(magika / "model.onnx")
    paths = [str(HERE), str(SHARED / "ppocr_rec"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    sys.path[:0] = [str(HERE), str(SHARED / "ppocr_rec")]
    ray.init(
        address="local",
        num_cpus=os.cpu_count() or 2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH",) + _ENV}},
    )


if __name__ == "__main__":
    raise SystemExit(main())
