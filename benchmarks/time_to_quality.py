"""Benchmark: time to quality. For each model and seed, the wall time from a search's start
until its outputs hold a model that meets the goal with every MatMul/Gemm/Conv quantized, for
the new default (``Auto`` on ``A8W8_SEARCH``) and for the previous default (TPE with Optuna's
defaults: 10 random start-up trials, independent sampling, no constant liar; 30 trials), both
with 2 trials at a time; NNCF's one shot and accuracy control in the same run (``--anchors``).

Goals (``quality.py``'s models and tolerances): magika 0.998 top-1 agreement, ppocr_rec 0.981
character accuracy, the benchmark encoder cosine 0.999. A trial meets the goal when it is a
candidate (within the tolerance) and its ``extra.quantized_share`` is 1 (every
MatMul/Gemm/Conv runs quantized; 16-bit promotions keep a node quantized, float ones do not).
Its time is the trial's ``elapsed_s`` in the journal: seconds since the search started
(preflight included) when the trial's record and model were written. Each search is capped
by ``stop.time_limit`` (``--cap-s``, 1800 by default); a run that does not get there reports
``time_to_goal_s: null``.

``--smoke`` (what ``tests/test_benchmarks_smoke.py`` runs): the encoder at the tests' tiny
size (seq 8, dim 16, ffn 32; the same rows and goal), seed 0, ``Auto``, at most 10 trials.

Usage::

    python benchmarks/time_to_quality.py --models encoder --seeds 0,1,2,3,4
    python benchmarks/time_to_quality.py --models magika --seeds 0,1,2 --algos Auto
    python benchmarks/time_to_quality.py --smoke     # the tiny encoder, one seed, Auto, 10 trials

Writes ``benchmarks/results/time_to_quality.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import Run, encoder_arrays, encoder_model, print_table, quiet  # noqa: E402
from quality import SHARED, _configs, start_ray  # noqa: E402

#: The previous default, kept here to compare against: TPE with Optuna's own defaults.
PREVIOUS = "TPEOptunaDefaults"
#: A quantized share at least this high quantizes every MatMul/Gemm/Conv.
FULL = 0.999
#: The smoke run's trials: the encoder's goal comes within the first stages (a few trials
#: after the defaults); Auto's later stages, which the smoke does not need, stay out.
SMOKE_TRIALS = 10
#: The smoke run's encoder: the tests' tiny size (the other smokes' too), the same goal.
SMOKE_ENCODER = {"seq": 8, "dim": 16, "ffn": 32}


def _register_previous() -> None:
    """The previous default's sampler as a strategy of this process (the searcher runs in
    the driver, this process): ``TPESampler(seed=seed)`` as raysearch built it before."""
    import optuna

    from raysearch.strategies import register_strategy
    from raysearch.strategies.samplers import OptunaPhase, _split

    def build(context: Any) -> list[Any]:
        spaces = context.spaces
        budgets: list[int | None] = [None] * len(spaces)
        if context.max_trials:
            budgets = list(_split(context.max_trials, len(spaces)))
        seed = context.seed
        return [
            OptunaPhase(
                space,
                i,
                "TPE",
                None if seed is None else seed + i,
                context.mode,
                context.reject,
                budget,
                sampler=optuna.samplers.TPESampler(seed=None if seed is None else seed + i),
            )
            for i, (space, budget) in enumerate(zip(spaces, budgets))
        ]

    register_strategy(PREVIOUS)(build)


def _smoke_encoder(config: dict[str, Any], work: Path) -> dict[str, Any]:
    """``config`` (the encoder's) on the tiny encoder, with as many rows as the full one."""
    folder = work / "smoke_encoder"
    folder.mkdir()
    np.savez(folder / "calib.npz", **encoder_arrays(64, seed=1, **SMOKE_ENCODER))
    np.savez(folder / "eval.npz", **encoder_arrays(64, seed=2, **SMOKE_ENCODER))
    return {
        **config,
        "model": str(encoder_model(folder, **SMOKE_ENCODER)),
        "calibration_data": str(folder / "calib.npz"),
        "eval_data": str(folder / "eval.npz"),
    }


def _meets_goal(record: dict[str, Any]) -> bool:
    extra = record.get("extra") or {}
    share = extra.get("quantized_share")
    return bool(record.get("is_candidate")) and share is not None and float(share) >= FULL


def run_one(
    name: str,
    config: dict[str, Any],
    algo: str,
    seed: int,
    cap_s: float,
    work: Path,
    keep: Path | None = None,
    trials: int | None = None,
) -> dict[str, Any]:
    """One search, capped at ``cap_s`` seconds (and at ``trials`` trials when given)."""
    from raysearch.search import AutoSearch

    folder = work / f"out-{name}-{algo}-{seed}"
    stop: dict[str, Any] = {"time_limit": cap_s}
    if algo == PREVIOUS:
        stop["iteration_limit"] = 30  # as quality.py measured the previous default
    elif trials is not None:
        stop["iteration_limit"] = trials
    config = {
        **config,
        "search_algo": algo,
        "seed": seed,
        "stop": stop,
        "output_dir": str(folder),
    }
    started = time.perf_counter()
    result = AutoSearch(config).run()
    wall = time.perf_counter() - started
    records = [r.to_dict() for r in result.records]
    records.sort(key=lambda r: float(r.get("elapsed_s") or 0.0))
    goal = next((r for r in records if _meets_goal(r)), None)
    ok = [r for r in records if r.get("status") == "ok"]
    full = [r for r in ok if float((r.get("extra") or {}).get("quantized_share") or 0) >= FULL]
    higher = bool(config.get("higher_is_better", True))
    pick = max if higher else min
    row = {
        "model": name,
        "algo": "Auto" if algo == "Auto" else "TPE (previous default)",
        "seed": seed,
        "time_to_goal_s": round(float(goal["elapsed_s"]), 1) if goal else None,
        "goal_trial": goal.get("number") if goal else None,
        "goal_stage": goal.get("stage") if goal else None,
        "goal_metric": goal.get("metric") if goal else None,
        "best_fully_quantized": pick((r["metric"] for r in full), default=None),
        "trials": len(records),
        "stop_reason": result.summary.get("stop_reason"),
        "wall_s": round(wall, 1),
    }
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:  # the search's folder kept (its journal and log say what each stage did)
        shutil.move(str(folder), str(keep / folder.name))
    return row


def _summaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for key in dict.fromkeys((r["model"], r["algo"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["algo"]) == key]
        times = [r["time_to_goal_s"] for r in mine]
        reached = [t for t in times if t is not None]
        out.append(
            {
                "model": key[0],
                "algo": key[1],
                "seeds": len(mine),
                "reached": len(reached),
                # A run that did not get there counts as the cap (it is at least that long).
                "median_time_to_goal_s": statistics.median(
                    [t if t is not None else float("inf") for t in times]
                )
                if times
                else None,
                "times_s": times,
                "median_wall_s": statistics.median(r["wall_s"] for r in mine),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="magika,ppocr_rec,encoder")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--algos", default=f"Auto,{PREVIOUS}")
    parser.add_argument("--cap-s", type=float, default=1800.0)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--anchors", action="store_true", help="NNCF's one shot and AC too")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny encoder, seed 0, Auto, 240 s cap, 10 trials"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep each search's folder here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.seeds, args.algos, args.cap_s = "encoder", "0", "Auto", 240.0
    quiet()
    import ray

    _register_previous()
    run = Run("time_to_quality", args)
    work = Path(tempfile.mkdtemp(prefix="raysearch-bench-ttq-"))
    start_ray()
    rows: list[dict[str, Any]] = []
    anchored: list[dict[str, Any]] = []
    try:
        configs = _configs(work, 30, args.concurrent)
        if args.smoke:
            configs["encoder"] = _smoke_encoder(configs["encoder"], work)
        for name in args.models.split(","):
            config = {k: v for k, v in configs[name].items() if k not in ("search_algo", "stop")}
            if args.anchors:
                from _quality_anchors import anchors

                anchored += anchors(name, configs[name], work, SHARED)
                print_table(anchored[-2:], list(anchored[-1]), title=f"{name}: NNCF anchors")
            for seed in (int(s) for s in args.seeds.split(",")):
                for algo in args.algos.split(","):
                    trials = SMOKE_TRIALS if args.smoke else None
                    rows.append(
                        run_one(name, config, algo, seed, args.cap_s, work, args.keep, trials)
                    )
                    print_table(rows[-1:], list(rows[-1]), title=f"{name} seed {seed}")
                    run.write(
                        {"results": rows, "summary": _summaries(rows), "anchors": anchored},
                        args.out,
                    )
        columns = ["model", "algo", "seeds", "reached", "median_time_to_goal_s"]
        print_table(_summaries(rows), columns)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
