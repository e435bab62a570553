"""How a ``raysearch run`` compares with the sequential loop, for ``sequential_vs_raysearch.py``:
its timeline, its best setting against the loop's, alternating pairs summed up as their median,
its fixed cost against Ray Tune's floor, and a Ray started with ``ray start --head`` for the
warm-cluster case.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from _common import ROOT, best_row, setting_id

METRIC = "cos"
#: Issue 37's targets for the fixed cost: the first trial at most this much later than Ray
#: Tune's floor (a Tuner of two no-op trials in a new process), and at most this long from the
#: last trial's end to the command's exit.
BEFORE_FIRST_EXCESS_TARGET_S = 1.0
AFTER_LAST_TARGET_S = 0.7


def timeline(run: dict[str, Any]) -> dict[str, float]:
    """Where a raysearch command's wall time went (actor clocks for the trials)."""
    trials = [r for r in run["trials"] if r["started_at"] and r["ended_at"]]
    first_start = min(r["started_at"] for r in trials)
    last_end = max(r["ended_at"] for r in trials)
    return {
        "before_first_trial_s": round(first_start - run["search_started_at"], 2),
        "trial_phase_s": round(last_end - first_start, 2),
        "after_last_trial_s": round(run["search_ended_at"] - last_end, 2),
    }


def whole(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials evaluated on every row (early stopping off, or not stopped)."""
    return [r for r in run["trials"] if r["status"] == "ok" and r["stopped_at_rung"] is None]


def tied_best(a: dict[str, Any]) -> set[str]:
    """The loop's best settings: several settings can give the very same metric, and the best
    setting counts as the same when raysearch's best is one of them."""
    best = best_row(a["trials"], METRIC, higher=True)
    return {setting_id(r["setting"]) for r in a["trials"] if abs(r[METRIC] - best[METRIC]) <= 1e-12}


def median_index(values: list[float]) -> int:
    """Index of the median of ``values`` (the lower of the two middle ones for an even
    count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def against_loop(case: dict[str, Any], a: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A raysearch run's figures against the loop run ``a``."""
    best_a = best_row(a["trials"], METRIC, higher=True)
    seq_by_id = {setting_id(r["setting"]): r for r in a["trials"]}
    complete = whole(run)
    best = best_row(complete, METRIC, higher=True)
    diffs = [
        abs(seq_by_id[setting_id(r["setting"])][METRIC] - r[METRIC])
        for r in complete
        if setting_id(r["setting"]) in seq_by_id
    ]
    rows = [r["eval_rows"] or 0 for r in run["trials"] if r["status"] == "ok"]
    return {
        "wall_s": round(run["wall_s"], 2),
        "ratio": round(a["wall_s"] / run["wall_s"], 3),
        "trials": len(run["trials"]),
        "failed": sum(1 for r in run["trials"] if r["status"] != "ok"),
        "stopped_early": sum(1 for r in run["trials"] if r["stopped_at_rung"] is not None),
        "eval_rows_run": sum(rows),
        "eval_rows_if_whole": len(run["trials"]) * len(next(iter(case["eval"].values()))),
        "calibrations_run": sum(
            1 for r in run["trials"] if r["status"] == "ok" and not r["calib_cache_hit"]
        ),
        "timeline": timeline(run),
        "load_average": [run["load_average_before"], run["load_average_after"]],
        "same_setting": setting_id(best["setting"]) in tied_best(a),
        "best_metric": best[METRIC],
        "summary_best_metric": run["best_metric"],
        "best_setting": best["setting"],
        "metric_abs_diff": abs(best_a[METRIC] - best[METRIC]),
        "max_abs_metric_diff_per_setting": max(diffs) if diffs else None,
        "settings_compared": len(diffs),
        "engine_s": round(sum(r["duration_s"] or 0.0 for r in run["trials"]), 2),
    }


def summarize_pairs(
    case: dict[str, Any], pairs: list[tuple[dict, dict]], target: float
) -> dict[str, Any]:
    """Alternating pairs (loop, raysearch) as the median pair's figures in full (``raysearch``)
    and every pair's in ``repeats``; ``target_met``: the median ratio at least ``target`` with
    the loop's best setting in every pair."""
    runs = [against_loop(case, a, b) for a, b in pairs]
    median = median_index([run["ratio"] for run in runs])
    repeats = [
        {
            "sequential_wall_s": round(a["wall_s"], 2),
            "raysearch_wall_s": run["wall_s"],
            "ratio": run["ratio"],
            "same_setting": run["same_setting"],
            "eval_rows_run": run["eval_rows_run"],
            "timeline": run["timeline"],
            "load_average_sequential": [a["load_average_before"], a["load_average_after"]],
            "load_average_raysearch": run["load_average"],
        }
        for (a, _), run in zip(pairs, runs)
    ]
    ratios = [r["ratio"] for r in repeats]
    ratio = runs[median]["ratio"]
    return {
        "sequential_wall_s": round(pairs[median][0]["wall_s"], 2),
        "raysearch_wall_s": runs[median]["wall_s"],
        # The median of the alternating pairs' ratios (the only pair's with --repeat 1).
        "ratio": ratio,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "median_pair": median,
        "repeats": repeats,
        "target_ratio": target,
        "target_met": bool(ratio >= target and all(r["same_setting"] for r in repeats)),
        "raysearch": runs[median],
    }


def against_floor(timeline: dict[str, float], floor: dict[str, float]) -> dict[str, Any]:
    """A run's fixed cost against Ray Tune's floor measured in the same run: the excess before
    the first trial (target at most 1 s) and the time after the last (at most 0.7 s), beside
    the floor's own shutdown."""
    excess = round(timeline["before_first_trial_s"] - floor["to_first_trial_s"], 2)
    after = timeline["after_last_trial_s"]
    return {
        "before_first_trial_s": timeline["before_first_trial_s"],
        "tune_to_first_trial_s": floor["to_first_trial_s"],
        "before_first_trial_excess_s": excess,
        "before_first_trial_target_s": BEFORE_FIRST_EXCESS_TARGET_S,
        "before_first_trial_target_met": excess <= BEFORE_FIRST_EXCESS_TARGET_S,
        "after_last_trial_s": after,
        "tune_shutdown_s": floor["shutdown_s"],
        "after_last_trial_excess_s": round(after - floor["shutdown_s"], 2),
        "after_last_trial_target_s": AFTER_LAST_TARGET_S,
        "after_last_trial_target_met": after <= AFTER_LAST_TARGET_S,
    }


@contextlib.contextmanager
def head_node(cpus: int) -> Iterator[dict[str, str]]:
    """A one-node Ray started with ``ray start --head`` (loopback, free ports, a temp folder
    of its own; ``tests/nodes.py``), as a workstation or cluster user has it running: yields
    the environment in which ``raysearch run`` with ``address: auto`` joins it. Its processes
    are killed at the end, also on failure: ``ray stop`` would stop every Ray of the machine,
    other users' too."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.nodes import NodeCluster

    with NodeCluster() as cluster:
        cluster.start("head", num_cpus=cpus)
        yield {**cluster.env, "RAY_ADDRESS": str(cluster.address)}


__all__ = [
    "METRIC",
    "against_floor",
    "against_loop",
    "head_node",
    "median_index",
    "print_report",
    "summarize_pairs",
    "tied_best",
    "timeline",
    "whole",
]


def print_report(
    cases: list[dict],
    warm: list[dict],
    grid48: list[dict],
    floors: list,
    tune_floors: list,
    latency: list[dict] = (),
) -> None:
    """The tables and one line per case, as the JSON holds them."""
    from _common import CPUS, print_table

    print()
    table = []
    for r in cases:
        for label, part in (
            ("early stopping", r["raysearch"]),
            ("every row", r["raysearch_every_row"]),
        ):
            table.append(
                {"model": r["model"], "case": f"cold, {label}", **r, **part, **part["timeline"]}
            )
    for r in warm:
        table.append(
            {
                "model": r["model"],
                "case": "warm",
                **r,
                **r["raysearch"],
                **r["raysearch"]["timeline"],
            }
        )
        first = r["first_search"]
        table.append(
            {
                "model": r["model"],
                "case": "warm, first search",
                "sequential_wall_s": r["sequential_wall_s"],
                **first,
                **first["timeline"],
            }
        )
    for r in grid48:
        table.append(
            {
                "model": r["model"],
                "case": "48 settings",
                **r,
                **r["raysearch"],
                **r["raysearch"]["timeline"],
            }
        )
    columns = [
        "model",
        "case",
        "sequential_wall_s",
        "wall_s",
        "ratio",
        "before_first_trial_s",
        "trial_phase_s",
        "after_last_trial_s",
        "eval_rows_run",
        "calibrations_run",
        "stopped_early",
        "same_setting",
        "metric_abs_diff",
    ]
    print_table(
        table, columns, title=f"sequential loop vs raysearch run ({CPUS} CPUs, metric {METRIC})"
    )
    for label, rows in (("cold", cases), ("warm", warm), ("48 settings", grid48)):
        for r in rows:
            print(
                f"{r['model']} {label}: ratio {r['ratio']:.2f}x (median of {len(r['repeats'])} "
                f"pairs: {', '.join(format(p['ratio'], '.2f') for p in r['repeats'])}); target "
                f">= {r['target_ratio']}: {'met' if r['target_met'] else 'NOT met'}; best {METRIC} "
                f"raysearch {r['raysearch']['best_metric']:.6f}, same setting as the loop in "
                f"every pair: {all(p['same_setting'] for p in r['repeats'])}; load "
                f"{r['raysearch']['load_average']}"
            )
            print(
                "    after the last trial, every pair: "
                + ", ".join(f"{p['timeline']['after_last_trial_s']} s" for p in r["repeats"])
            )
            if "fixed_cost" in r:
                f = r["fixed_cost"]
                print(
                    f"    fixed cost: first trial {f['before_first_trial_s']} s, Tune's floor "
                    f"{f['tune_to_first_trial_s']} s, excess {f['before_first_trial_excess_s']} s "
                    f"(target <= {f['before_first_trial_target_s']}: "
                    f"{'met' if f['before_first_trial_target_met'] else 'NOT met'}); after the "
                    f"last trial {f['after_last_trial_s']} s (Tune's shutdown "
                    f"{f['tune_shutdown_s']} s; target <= {f['after_last_trial_target_s']}: "
                    f"{'met' if f['after_last_trial_target_met'] else 'NOT met'})"
                )
    for r in latency:
        print(
            f"{r['model']} select: latency: after the last trial "
            f"{', '.join(f'{t} s' for t in r['after_last_trial_s_latency'])} against "
            f"{', '.join(f'{t} s' for t in r['after_last_trial_s_metric'])} with select: metric; "
            f"timing again alone adds {r['added_after_last_trial_s']} s (median of "
            f"{len(r['pairs'])} pairs, {r['added_min_s']}-{r['added_max_s']} s)"
        )
    print(f"Ray alone (start to first actor call, shutdown): {floors}")
    print(f"Ray Tune alone (start to first trial, shutdown): {tune_floors}")
