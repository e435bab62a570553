"""The 12-setting grid written two ways, for ``sequential_vs_raysearch.py --cases spaces``: as
one space (``calibrate_method: [MinMax, Percentile]``, the percentile in a group) and as
Quark's two-space form (``search_spaces:`` a MinMax space and a Percentile space), each run's
figures and the alternating runs summed up.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = [
    "FORMS",
    "calibration_entries",
    "form_figures",
    "print_forms",
    "summarize_forms",
    "two_space_form",
]

#: The two forms, in the order each pair runs them.
FORMS = ("one space", "two spaces")


def two_space_form(
    op_types: list[str], activations: list[str], per_channel: list[bool]
) -> list[dict[str, Any]]:
    """The 12 settings as Quark's AutoSearch writes them: one space per calibration method."""
    common = {
        "activation_type": activations,
        "per_channel": per_channel,
        "weight_type": ["QInt8"],
        "op_types_to_quantize": [op_types],
    }
    return [
        {"calibrate_method": ["MinMax"], **common},
        {
            "calibrate_method": ["Percentile"],
            "extra_options": {"CalibPercentile": [99.99, 99.999]},
            **common,
        },
    ]


def calibration_entries(output_dir: Path) -> int:
    """The calibrations the search's cache computed: its MinMax and histogram files (one per
    calibration run; a trial served by the cache, or that waited for another trial's
    calibration, writes none)."""
    folder = output_dir / "cache" / "calibration"
    return len(list(folder.glob("*/minmax-*.json"))) + len(list(folder.glob("*/hist-*.npz")))


def form_figures(run: dict[str, Any]) -> dict[str, Any]:
    """One run's wall time, its calibrations (trials without a cache hit: each calibrated, or
    waited for a calibration in flight), the entries its cache computed, and its trials
    stopped at a rung."""
    ok = [r for r in run["trials"] if r["status"] == "ok"]
    return {
        "wall_s": round(run["wall_s"], 2),
        "trials": len(run["trials"]),
        "calibrations": sum(1 for r in ok if not r["calib_cache_hit"]),
        "calibration_s": round(
            sum(r["calibration_s"] or 0.0 for r in ok if not r["calib_cache_hit"]), 2
        ),
        "calibration_entries": run["calibration_entries"],
        "stopped_at_rung": sum(1 for r in ok if r["stopped_at_rung"] is not None),
        "best_metric": run["best_metric"],
        "best_params": run["best_params"],
        "load_average": [run["load_average_before"], run["load_average_after"]],
    }


def summarize_forms(model: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each form's runs and medians; ``same_calibrations``: every run of both forms counted
    the same calibrations; ``within_noise``: the medians' difference is no larger than the
    spread between runs of one form (the larger of the two forms' spreads)."""
    medians = {form: statistics.median(r["wall_s"] for r in rows) for form, rows in runs.items()}
    spreads = {
        form: max(r["wall_s"] for r in rows) - min(r["wall_s"] for r in rows)
        for form, rows in runs.items()
    }
    difference = medians["two spaces"] - medians["one space"]
    noise = max(spreads.values())
    counts = {r["calibrations"] for rows in runs.values() for r in rows}
    return {
        "model": model,
        "runs": runs,
        "median_wall_s": {form: round(value, 2) for form, value in medians.items()},
        "spread_s": {form: round(value, 2) for form, value in spreads.items()},
        "difference_s": round(difference, 2),
        "same_calibrations": len(counts) == 1,
        "within_noise": abs(difference) <= noise,
    }


def print_forms(rows: list[dict[str, Any]]) -> None:
    """One line per run, then each model's verdict."""
    for row in rows:
        for form in FORMS:
            for number, r in enumerate(row["runs"][form]):
                print(
                    f"{row['model']} {form} (run {number + 1}): {r['wall_s']} s, "
                    f"{r['calibrations']} calibrations ({r['calibration_s']} s, "
                    f"{r['calibration_entries']} computed), {r['stopped_at_rung']} of "
                    f"{r['trials']} trials stopped at a rung, best cos {r['best_metric']:.6f}, "
                    f"load {r['load_average']}"
                )
        print(
            f"{row['model']} one space vs two spaces: median {row['median_wall_s']['one space']} "
            f"s vs {row['median_wall_s']['two spaces']} s (difference {row['difference_s']} s; "
            f"spread between runs of one form {row['spread_s']}); same calibration count in "
            f"every run: {row['same_calibrations']}; difference within noise: "
            f"{row['within_noise']}"
        )
