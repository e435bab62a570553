"""Search efficiency: how many trials Random, TPE (Optuna's defaults and raysearch's
configuration, side by side) and Grid need before the first candidate.

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
3. The searchers are replayed offline with a budget of ``--budget`` trials (default 30, the
   quality benchmark's searches): raysearch's own ``SettingSearcher`` (an Optuna sampler in
   an ``OptunaPhase``, inside Ray Tune's ``OptunaSearch``, with raysearch's rule that a
   setting never runs twice; the expanded grid in order for Grid) is asked for trials and told
   the precomputed metric, for seeds 0..N-1 (default 100; ``--first-seed`` moves them),
   until the first candidate or the budget. A seed that finds none within the budget counts
   as never found (an infinite count in the median).

The rows (``ROWS``): Random; TPE with ``TPESampler(seed=seed)`` as raysearch built it before
(Optuna's defaults: 10 start-up trials whatever the budget; multivariate, and constant liar on,
in the installed Optuna 5.0); TPE with ``multivariate=False`` (univariate, 10 start-up);
raysearch's TPE (``make_sampler("TPE", seed, budget=...)``: a tenth of the budget as start-up
trials, at least 3) and variations of it (start-up 2 and 6, ``group=True``); Grid. Most rows
keep one trial outstanding: the searcher is told each result before the next suggestion, so
the constant liar (which only acts on trials running while another is asked) cannot show
there. The two ``4 outstanding`` rows keep four trials suggested and unfinished (the oldest
finishes first: equal trial times), with ``constant_liar`` off and on, and also count the
proposals that repeated a running setting (``running_repeats``; raysearch answers them as
failed trials and asks again).

This measures the samplers' order, not Ray: no trial runs during the replay. Grid's order does
not depend on the seed. ``median_first_10`` is the median over the first 10 seeds only (the
earlier version of this benchmark ran seeds 0-9; a 10-seed median moves by several trials
between seed sets).

Usage::

    python benchmarks/search_efficiency.py            # 100 seeds, budget 30
    python benchmarks/search_efficiency.py --quick    # the same (it is cheap)
    python benchmarks/search_efficiency.py --smoke    # a 24-setting space, 2 seeds (tests)
    python benchmarks/search_efficiency.py --budget 0 # no trial limit
    python benchmarks/search_efficiency.py --first-seed 100 --out FILE  # seeds 100-199

Writes ``benchmarks/results/search_efficiency.json`` (the run with ``--first-seed 100``:
``search_efficiency_seeds_100-199.json``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CPUS, Run, encoder_arrays, encoder_model, print_table, quiet  # noqa: E402

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import Evaluator  # noqa: E402
from raysearch.quantize.registry import get_backend  # noqa: E402
from raysearch.search.tune.searchers import SettingSearcher  # noqa: E402
from raysearch.space import SearchSpace, settings_key  # noqa: E402
from raysearch.strategies.samplers import OptunaPhase, quiet_optuna, startup_trials  # noqa: E402
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


@dataclass(frozen=True)
class Row:
    """One replayed configuration: ``name`` (the table's row), ``algo`` (the strategy), the
    Optuna sampler built from ``(seed, budget)`` (None: raysearch's own, ``make_sampler``),
    the trials kept outstanding, and the concurrency raysearch's sampler is built for."""

    name: str
    algo: str
    sampler: Callable[[int, int | None], Any] | None = None
    outstanding: int = 1
    concurrent: int = 1


def _tpe(**kwargs: Any) -> Callable[[int, int | None], Any]:
    def build(seed: int, budget: int | None) -> Any:
        import warnings

        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            args = {k: v(budget) if callable(v) else v for k, v in kwargs.items()}
            return optuna.samplers.TPESampler(seed=seed, **args)

    return build


ROWS = (
    Row("Random", "Random"),
    Row("TPE (Optuna defaults)", "TPE", _tpe()),
    Row("TPE multivariate=False", "TPE", _tpe(multivariate=False)),
    Row("TPE start-up 2", "TPE", _tpe(n_startup_trials=2, multivariate=True)),
    Row("TPE (raysearch)", "TPE"),
    Row("TPE start-up 6", "TPE", _tpe(n_startup_trials=6, multivariate=True)),
    Row(
        "TPE (raysearch) group=True",
        "TPE",
        _tpe(n_startup_trials=startup_trials, multivariate=True, group=True),
    ),
    Row("TPE (raysearch) 4 outstanding, no liar", "TPE", outstanding=4, concurrent=1),
    Row("TPE (raysearch) 4 outstanding", "TPE", outstanding=4, concurrent=4),
    Row("Grid", "Grid"),
)


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


class _CountingPhase(OptunaPhase):
    """An ``OptunaPhase`` that counts the proposals repeating a running setting."""

    running_repeats = 0

    def _answered(self, proposal: Any, search: Any) -> bool:
        if proposal.key not in search.done and proposal.key in search.live_keys:
            self.running_repeats += 1
        return super()._answered(proposal, search)


def _searcher(
    row: Row, space: SearchSpace, seed: int, budget: int | None
) -> tuple[SettingSearcher, _CountingPhase | None]:
    if row.algo == "Grid":
        grid = SettingSearcher.strategy(
            "Grid", [space], mode="min", reject=reject, max_trials=budget
        )
        return grid, None
    sampler = row.sampler(seed, budget) if row.sampler is not None else None
    phase = _CountingPhase(
        space,
        0,
        row.algo,
        seed,
        "min",
        reject,
        budget,
        concurrent=row.concurrent,
        sampler=sampler,
    )
    # ``replay`` keeps at most ``row.outstanding`` suggested and unfinished, as Tune's
    # ConcurrencyLimiter does around the searcher in a search.
    searcher = SettingSearcher([phase], mode="min", max_trials=budget)
    return searcher, phase


def replay(
    row: Row,
    space: SearchSpace,
    metrics: dict[str, float],
    tolerance: float,
    seed: int,
    budget: int | None,
) -> dict[str, Any]:
    """Trials started until the first candidate (``metric <= tolerance``) is, when ``row``
    proposes with ``row.outstanding`` trials suggested and unfinished (the oldest finishes
    first); ``trials`` None: none within the budget."""
    started = 0
    asked = 0
    live: deque[tuple[str, float]] = deque()
    with quiet_optuna():
        searcher, phase = _searcher(row, space, seed, budget)

        def result(found: int | None) -> dict[str, Any]:
            repeats = phase.running_repeats if phase is not None else 0
            return {"seed": seed, "trials": found, "running_repeats": repeats}

        while True:
            while len(live) < row.outstanding:
                trial_id = f"t{asked}"
                asked += 1
                config = searcher.suggest(trial_id)
                if not isinstance(config, dict):
                    break  # waits for a result (None), or is done
                started += 1
                metric = metrics.get(config["key"])
                if metric is None:
                    raise RuntimeError(f"{row.name} proposed a setting outside the grid: {config}")
                if metric <= tolerance:
                    return result(started)
                live.append((trial_id, metric))
            if not live:
                return result(None)
            trial_id, metric = live.popleft()
            finite = math.isfinite(metric)
            searcher.on_trial_complete(
                trial_id, {"metric": metric if finite else None}, error=not finite
            )


def summarize(row: Row, runs: list[dict[str, Any]], budget: int | None) -> dict[str, Any]:
    """Median trials to the first candidate (never found counts as infinite; None when the
    median is), over every seed and over the first 10."""

    def median(values: list[int | None]) -> float | None:
        if not values:
            return None
        middle = statistics.median([math.inf if v is None else v for v in values])
        return None if math.isinf(middle) else middle

    per_seed = [r["trials"] for r in runs]
    found = [t for t in per_seed if t is not None]
    return {
        "algo": row.name,
        "strategy": row.algo,
        "outstanding": row.outstanding,
        "concurrent": row.concurrent,
        "budget": budget,
        "seeds": len(runs),
        "median_trials": median(per_seed),
        "median_first_10": median(per_seed[:10]),
        "mean_trials_found": round(statistics.fmean(found), 2) if found else None,
        "min_trials": min(found) if found else None,
        "max_trials": max(found) if found else None,
        "never_found": len(per_seed) - len(found),
        "running_repeats_per_seed": round(statistics.fmean(r["running_repeats"] for r in runs), 2),
        "replay_s": None,
        "per_seed": per_seed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same as the full run")
    parser.add_argument("--smoke", action="store_true", help="24-setting space, 2 seeds")
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds (default 100)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--budget", type=int, default=30, help="trials per replay (0: no limit; default 30)"
    )
    parser.add_argument("--top", type=float, default=0.04, help="fraction of candidates")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("search_efficiency", args)
    seeds = args.seeds or (2 if args.smoke else 100)
    budget = args.budget if args.budget and args.budget > 0 else None
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
    for row in ROWS:
        began = time.perf_counter()
        runs = [
            replay(row, space, metrics, tolerance, seed, budget)
            for seed in range(args.first_seed, args.first_seed + seeds)
        ]
        rows.append(summarize(row, runs, budget))
        rows[-1]["replay_s"] = round(time.perf_counter() - began, 2)
    # What uniform random order would give on average: (n + 1) / (candidates + 1).
    expected_random = (n + 1) / (candidates + 1)
    print_table(
        rows,
        [
            "algo",
            "seeds",
            "median_trials",
            "median_first_10",
            "mean_trials_found",
            "min_trials",
            "max_trials",
            "never_found",
            "running_repeats_per_seed",
        ],
        title=(
            f"trials until the first candidate ({n} settings, {candidates} candidates, budget "
            f"{budget or 'none'}; uniform sampling without repeats expects "
            f"{expected_random:.1f})"
        ),
    )
    run.write(
        {
            "metric": METRIC,
            "space_size": n,
            "tolerance": tolerance,
            "top_fraction": args.top,
            "budget": budget,
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
