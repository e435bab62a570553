"""Benchmark (a check on a real model): several objectives on magika.

One search on magika (``../shared/models/magika``; top-1 agreement with the float model on its
500 evaluation rows, ``_quality_evaluators.magika_top1``, tolerance 0.01 absolute so that
several settings are candidates) with ``objectives: [metric, latency_ms, model_size_mb]``,
``select: latency``, ``search_algo: NSGAII`` (sampling on the three objectives), the
``A8W8_SEARCH`` preset, ``--trials`` trials (24), 2 at a time, seed ``--seed``.

It checks, and prints, what issue 35's acceptance asks:

- ``pareto.parquet`` equals a brute-force non-dominated filter of ``results.parquet``'s
  candidates, written here independently of raysearch (metric negated, latency, size in MB;
  a missing latency is the slowest);
- ``best/`` holds the fastest candidate (``summary.json``'s ``best_trial_id``; ties by the
  metric), and its model file is that candidate's.

Run::

    python benchmarks/pareto.py                  # 24 trials, seed 0
    python benchmarks/pareto.py --trials 12 --seed 1

Writes ``benchmarks/results/pareto_magika.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import RESULTS, Run, print_table, quiet  # noqa: E402
from quality import _configs, start_ray  # noqa: E402

OBJECTIVES = ["metric", "latency_ms", "model_size_mb"]


def brute_front(rows: list[dict[str, Any]]) -> list[str]:
    """Trial ids of the candidates no other candidate beats on every objective and strictly
    on one (top-1 higher is better: negated), in the rows' order."""

    def values(row: dict[str, Any]) -> tuple[float, ...]:
        latency = row["latency_ms"]
        return (
            -row["metric"],
            math.inf if latency is None else latency,
            row["model_size_bytes"] / 1e6,
        )

    candidates = [r for r in rows if r["status"] == "ok" and r["is_candidate"]]
    front = []
    for row in candidates:
        mine = values(row)
        beaten = any(
            all(o <= m for o, m in zip(values(other), mine))
            and any(o < m for o, m in zip(values(other), mine))
            for other in candidates
        )
        if not beaten:
            front.append(row["trial_id"])
    return front


def fastest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate of the lowest latency, ties by the higher metric."""
    candidates = [r for r in rows if r["status"] == "ok" and r["is_candidate"]]
    return min(candidates, key=lambda r: (r["latency_ms"], -r["metric"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "pareto_magika.json")
    args = parser.parse_args(argv)
    quiet()
    run = Run("pareto_magika", args)
    work = Path(tempfile.mkdtemp(prefix="rs-pareto-"))
    import pyarrow.parquet as pq
    import ray

    from raysearch.search import AutoSearch

    start_ray()
    try:
        config = {
            **_configs(work, args.trials)["magika"],
            "tolerance": 0.01,
            "search_algo": "NSGAII",
            "seed": args.seed,
            "objectives": OBJECTIVES,
            "select": "latency",
            "output_dir": str(work / "out"),
        }
        result = AutoSearch(config).run(progress=False)
        out = result.output_dir
        rows = pq.read_table(out / "results.parquet").to_pylist()
        pareto = pq.read_table(out / "pareto.parquet").to_pylist()
        summary = result.summary
        expected_front = brute_front(rows)
        best = fastest(rows)
        kept = out / "candidates" / f"{best['trial_id']}.onnx"
        checks = {
            "pareto_equals_brute_force": [r["trial_id"] for r in pareto] == expected_front,
            "pareto_rows_are_results_rows": pareto
            == [r for r in rows if r["trial_id"] in set(expected_front)],
            "best_is_fastest_candidate": summary["best_trial_id"] == best["trial_id"],
            "best_model_is_its_file": kept.exists()
            and (out / "best" / "model.onnx").read_bytes() == kept.read_bytes(),
        }
        front_rows = [r for r in rows if r["trial_id"] in set(expected_front)]
        print_table(
            [
                {
                    "trial": r["trial_id"][-5:],
                    "top1": round(r["metric"], 4),
                    "latency_ms": round(r["latency_ms"], 3),
                    "size_mb": round(r["model_size_bytes"] / 1e6, 3),
                }
                for r in front_rows
            ],
            ["trial", "top1", "latency_ms", "size_mb"],
            "Pareto front (candidates)",
        )
        for name, ok in checks.items():
            print(f"{name}: {ok}")
        run.write(
            {
                "model": "magika",
                "trials": len(rows),
                "failed": sum(r["status"] != "ok" for r in rows),
                "candidates": sum(bool(r["is_candidate"]) for r in rows if r["status"] == "ok"),
                "objectives": summary["objectives"],
                "select": summary["select"],
                "front": [
                    {
                        "trial_id": r["trial_id"],
                        "metric": r["metric"],
                        "latency_ms": r["latency_ms"],
                        "model_size_mb": r["model_size_bytes"] / 1e6,
                    }
                    for r in front_rows
                ],
                "best_trial_id": summary["best_trial_id"],
                "fastest_candidate": best["trial_id"],
                "checks": checks,
                "all_checks_pass": all(checks.values()),
            },
            args.out,
        )
        return 0 if all(checks.values()) else 1
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
