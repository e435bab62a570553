"""Search efficiency: how many trials Random, TPE and Grid need before the first candidate.

The space (conditional dialect, 336 valid settings): calibrate_method MinMax (with and without
CalibMovingAverage), Entropy, Percentile (99.9, 99.99, 99.999, 99.9999) x activation/weight
types (QUInt8/QInt8, QUInt8/QUInt8, QInt8/QInt8; ONNX Runtime refuses QInt8 activations with
QUInt8 weights) x per_channel x ActivationSymmetric x WeightSymmetric x op_types_to_quantize
([MatMul] or every op ONNX Runtime quantizes), on a small transformer encoder
(``tests.models.make_encoder_model``, seq 8, dim 16, ffn 32), metric L2.

1. Every setting's metric is computed once, sequentially in this process, with raysearch's
   ``TrialRunner`` (calibration cache shared).
2. The tolerance is chosen from that full pass: the L2 of the setting ranked at the best
   ``--top`` fraction (default 4 %), so only the best few percent of settings are candidates.
3. The searchers are replayed offline: raysearch's own ``SettingSearcher`` (the Optuna
   sampler inside Ray Tune's ``OptunaSearch`` for Random and TPE, with raysearch's rule that a
   setting never runs twice; the expanded grid in order for Grid) is asked for one trial at a
   time and told the precomputed metric, for seeds 0-9, until the first candidate.

This measures the samplers' order, not Ray: no trial runs during the replay, and one trial is
outstanding at a time (a live search on N slots keeps up to 2N suggestions outstanding, which
gives TPE slightly less information per suggestion). Grid's order does not depend on the seed.
Reported, not tuned to.

Usage::

    python benchmarks/search_efficiency.py            # 10 seeds
    python benchmarks/search_efficiency.py --quick    # 10 seeds (the same; it is cheap)
    python benchmarks/search_efficiency.py --smoke    # a 24-setting space, 2 seeds (tests)

Writes ``benchmarks/results/search_efficiency.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CPUS, Run, encoder_arrays, encoder_model, print_table, quiet  # noqa: E402

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import Evaluator  # noqa: E402
from raysearch.quantize.registry import get_backend  # noqa: E402
from raysearch.search.record.journal import settings_key  # noqa: E402
from raysearch.search.tune.searchers import SettingSearcher, quiet_optuna  # noqa: E402
from raysearch.space import SearchSpace  # noqa: E402
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec  # noqa: E402

METRIC = "L2"  # lower is better
SIZE = {"seq": 8, "dim": 16, "ffn": 32}
SPACE: dict[str, Any] = {
    "calibrate_method": ["MinMax", "Entropy", "Percentile"],
    "minmax": {
        "only_if": {"calibrate_method": "MinMax"},
        "extra_options": {"CalibMovingAverage": [False, True]},
    },
    "percentile": {
        "only_if": {"calibrate_method": "Percentile"},
        "extra_options": {"CalibPercentile": [99.9, 99.99, 99.999, 99.9999]},
    },
    "activation_type": ["QUInt8", "QInt8"],
    "weight_type": ["QInt8", "QUInt8"],
    "per_channel": [True, False],
    "extra_options": {"ActivationSymmetric": [False, True], "WeightSymmetric": [True, False]},
    "op_types_to_quantize": [["MatMul"], None],
}
SMOKE_SPACE: dict[str, Any] = {
    "calibrate_method": ["MinMax", "Percentile"],
    "percentile": {
        "only_if": {"calibrate_method": "Percentile"},
        "extra_options": {"CalibPercentile": [99.9, 99.999]},
    },
    "activation_type": ["QUInt8", "QInt8"],
    "per_channel": [True, False],
    "extra_options": {"ActivationSymmetric": [False, True]},
}
ALGOS = ("Random", "TPE", "Grid")


def reject(settings: dict[str, Any]) -> str | None:
    return get_backend(settings.get("quantizer")).reject(settings)


def full_pass(space: SearchSpace, folder: Path, eval_rows: int) -> tuple[dict[str, float], dict]:
    """Every valid setting's metric (``settings_key`` -> L2), computed once."""
    model = encoder_model(folder, **SIZE)
    calib = DataSource.load(encoder_arrays(100, seed=3, **SIZE), model, batch_size=50)
    evaluation = DataSource.load(encoder_arrays(eval_rows, seed=9, **SIZE), model, batch_size=50)
    runner = TrialRunner(
        TrialSpec(
            model,
            calib,
            evaluation,
            Evaluator(METRIC, tolerance=math.inf),
            cache_dir=folder / "cache",
            device=TrialDevice(threads=CPUS),
            measure_latency=False,
        )
    )
    metrics: dict[str, float] = {}
    failed = []
    started = time.perf_counter()
    with runner:
        for point in space.expand(reject=reject).points:
            settings = space.to_settings(point)
            result = runner.run(settings, folder / "trial.onnx")
            key = settings_key(settings)
            if result.ok and result.metric is not None and math.isfinite(result.metric):
                metrics[key] = result.metric
            else:
                metrics[key] = math.inf  # never a candidate
                failed.append({"settings": settings, "error": result.error})
    info = {"full_pass_s": round(time.perf_counter() - started, 2), "failed": failed}
    return metrics, info


def replay(
    algo: str, space: SearchSpace, metrics: dict[str, float], tolerance: float, seed: int
) -> dict[str, Any]:
    """Trials until the first candidate (``metric <= tolerance``) when ``algo`` proposes."""
    trials = 0
    best = math.inf
    with quiet_optuna():
        if algo == "Grid":
            searcher = SettingSearcher.grid([space], mode="min", reject=reject, max_outstanding=1)
        else:
            searcher = SettingSearcher.sampler(
                algo, [space], mode="min", seed=seed, reject=reject, max_outstanding=1
            )
        while True:
            trial_id = f"t{trials}"
            config = searcher.suggest(trial_id)
            if not isinstance(config, dict):
                return {"seed": seed, "trials": None, "exhausted_after": trials}
            trials += 1
            metric = metrics.get(config["key"])
            if metric is None:
                raise RuntimeError(f"{algo} proposed a setting outside the grid: {config}")
            best = min(best, metric)
            result = {"metric": metric if math.isfinite(metric) else None}
            searcher.on_trial_complete(trial_id, result, error=not math.isfinite(metric))
            if metric <= tolerance:
                return {"seed": seed, "trials": trials, "metric": metric}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same as the full run")
    parser.add_argument("--smoke", action="store_true", help="24-setting space, 2 seeds")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 10)")
    parser.add_argument("--top", type=float, default=0.04, help="fraction of candidates")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("search_efficiency", args)
    seeds = args.seeds or (2 if args.smoke else 10)
    space = SearchSpace.parse(SMOKE_SPACE if args.smoke else SPACE)
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-eff-") as tmp:
        metrics, info = full_pass(space, Path(tmp), 100 if args.smoke else 500)
    n = len(metrics)
    ranked = sorted(metrics.values())
    k = max(1, math.ceil(args.top * n))
    tolerance = ranked[k - 1]
    candidates = sum(1 for m in ranked if m <= tolerance)
    print(
        f"{n} settings computed in {info['full_pass_s']} s; tolerance {METRIC} <= "
        f"{tolerance:.6g} (best {args.top:.0%}): {candidates} candidates; best {ranked[0]:.6g}"
    )
    rows = []
    for algo in ALGOS:
        runs = [replay(algo, space, metrics, tolerance, seed) for seed in range(seeds)]
        counts = [r["trials"] for r in runs if r["trials"] is not None]
        rows.append(
            {
                "algo": algo,
                "seeds": seeds,
                "median_trials": statistics.median(counts) if counts else None,
                "mean_trials": round(statistics.fmean(counts), 2) if counts else None,
                "min_trials": min(counts) if counts else None,
                "max_trials": max(counts) if counts else None,
                "never_found": sum(1 for r in runs if r["trials"] is None),
                "per_seed": [r["trials"] for r in runs],
            }
        )
    # What uniform random order would give on average: (n + 1) / (candidates + 1).
    expected_random = (n + 1) / (candidates + 1)
    print_table(
        rows,
        ["algo", "seeds", "median_trials", "mean_trials", "min_trials", "max_trials"],
        title=(
            f"trials until the first candidate ({n} settings, {candidates} candidates; "
            f"uniform sampling without repeats expects {expected_random:.1f})"
        ),
    )
    run.write(
        {
            "metric": METRIC,
            "space_size": n,
            "tolerance": tolerance,
            "top_fraction": args.top,
            "candidates": candidates,
            "best_metric": ranked[0],
            "expected_trials_uniform_without_repeats": round(expected_random, 2),
            "full_pass_s": info["full_pass_s"],
            "failed_settings": info["failed"],
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
