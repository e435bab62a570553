"""Parameter importance over the trials that scored: on a grid where one parameter decides and
early stopping stopped most of its bad settings (as on ``raysearch demo``: every-op settings
near -1, MatMul/Conv-only ones near 1), that parameter ranks first in ``summary.json``, in
``plots/param_importance.png`` and in the report, each saying which trials are behind it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from raysearch.config import SearchConfig
from raysearch.outputs import _plots
from raysearch.outputs._study import study_figures
from raysearch.trialrecord import TrialRecord

EVERY_OP = None
MATMUL_CONV = ["MatMul", "Conv"]
TRIALS = "24 trials: 13 complete, 11 stopped at a rung with their scores over the rows they reached"


def _grid() -> list[dict[str, Any]]:
    """24 settings: op types x (MinMax, Percentile 99.99, Percentile 99.999) x per-channel x
    symmetric activations. Every-op settings score about -0.99, and 11 of their 12 were stopped
    at the first rung; MatMul/Conv-only ones about 0.9998, 99.999 a hair better than 99.99."""
    rows = []
    methods = [("MinMax", None), ("Percentile", 99.99), ("Percentile", 99.999)]
    grid = itertools.product([EVERY_OP, MATMUL_CONV], methods, [True, False], [False, True])
    for i, (ops, (method, percentile), per_channel, symmetric) in enumerate(grid):
        params: dict[str, Any] = {
            "op_types_to_quantize": ops,
            "calibrate_method": method,
            "per_channel": per_channel,
            "extra_options.ActivationSymmetric": symmetric,
        }
        if percentile is not None:
            params["extra_options.CalibPercentile"] = percentile
        if ops is EVERY_OP:
            metric = -0.99 + 0.001 * (i % 5)
        else:
            metric = 0.9997 + (0.0001 if percentile == 99.999 else 0.0) + 0.00001 * (i % 3)
        rows.append(
            TrialRecord.from_dict(
                {
                    "trial_id": f"t{i}",
                    "number": i + 1,
                    "status": "ok",
                    "metric": metric,
                    "is_candidate": metric > 0.99,
                    "stopped_at_rung": 0 if ops is EVERY_OP and i != 0 else None,
                    "params": params,
                }
            )
        )
    return rows


def _config(tmp_path: Path) -> SearchConfig:
    return SearchConfig.from_dict(
        {
            "model": "m.onnx",
            "calibration_data": "c.npz",
            "search_space": {"per_channel": [True, False]},
            "metric": "cos",
            "tolerance": 0.99,
            "output_dir": str(tmp_path),
        },
        check_paths=False,
    )


@pytest.fixture
def figures(monkeypatch) -> list:
    saved: list = []
    monkeypatch.setattr(_plots, "_save_figure", lambda fig, path: saved.append(fig))
    return saved


def test_the_parameter_that_decides_ranks_first_though_its_bad_settings_were_stopped(
    figures, tmp_path
):
    summary: dict = {}
    _plots.write_plots(_grid(), tmp_path, _config(tmp_path), None, summary)
    ranking = list(summary["param_importance"])
    assert ranking[0] == "op_types_to_quantize", summary["param_importance"]
    assert summary["param_importance"]["op_types_to_quantize"] > 0.5
    assert summary["param_importance_trials"] == 24
    assert summary["param_importance_stopped"] == 11
    title = figures[-1].axes[0].get_title()
    # The title is wrapped to the figure's width; its words are the ones given.
    assert title.split("\n")[0] == "parameter importance for cos", title
    assert " ".join(title.split()) == f"parameter importance for cos ({TRIALS})"


def test_the_report_shows_the_importances_of_the_summary_and_the_trials_behind_them(tmp_path):
    summary: dict = {"higher_is_better": True, "metric": "cos"}
    _plots.write_plots(_grid(), tmp_path, _config(tmp_path), None, summary)
    (figure,) = [f for f in study_figures(_grid(), summary) if f.key == "importances"]
    assert figure.figure.layout.title.text == f"Parameter importances ({TRIALS})"
    (bars,) = figure.figure.data
    assert dict(zip(bars.y, bars.x, strict=True)) == pytest.approx(summary["param_importance"])
    assert bars.y[-1] == "op_types_to_quantize"  # a horizontal bar chart lists bottom-up
    assert figure.caption == (
        f"Optuna's PED-ANOVA importance of each parameter for cos, over the {TRIALS} (shown "
        "from 10 such trials on; a parameter is judged over the trials that have it)."
    )


def test_sensitivity_probes_are_no_input_to_the_importances():
    """Issue 58 item 7: WeightOnly's probes (one node at 4 bits, every other float) score far
    better than any full setting by what they leave float; counted, their node lists ranked
    first. The importances are over the settings searched, the probes left out."""
    from raysearch.outputs._importance import param_importances, scored

    full = [
        {
            "status": "ok",
            "stage": "blocks",
            "metric": 0.05 + 0.01 * (block == 32) + 0.001 * i,
            "params": {"block_size": block, "symmetric": symmetric},
        }
        for i, (block, symmetric) in enumerate(itertools.product([32, 64, 128], [True, False]))
    ] * 2
    nodes = [f"n{i}" for i in range(8)]
    probes = [
        {
            "status": "ok",
            "stage": "sensitivity",
            "metric": 0.001 * (i + 1),
            "params": {
                "block_size": 64,
                "symmetric": True,
                "nodes_4bit": [node],
                "nodes_float": [n for n in nodes if n != node],
            },
        }
        for i, node in enumerate(nodes)
    ]
    full = [TrialRecord.from_dict(r) for r in full]
    probes = [TrialRecord.from_dict(r) for r in probes]
    assert scored(full + probes) == full
    importances = param_importances(full + probes, higher=False)
    assert sorted(importances) == ["block_size", "symmetric"]
    assert next(iter(importances)) == "block_size"


def test_the_report_draws_the_summarys_importances_without_computing_them_again(
    figures, tmp_path, monkeypatch
):
    """The report is written after the last trial, from the summary that holds the
    importances already: PED-ANOVA is not run a second time for its figure."""
    from raysearch.outputs import _importance

    summary: dict = {"higher_is_better": True, "metric": "cos"}
    _plots.write_plots(_grid(), tmp_path, _config(tmp_path), None, summary)

    def computed_again(rows, higher):
        raise AssertionError("the importances were computed again")

    monkeypatch.setattr(_importance, "param_importances", computed_again)
    (figure,) = [f for f in study_figures(_grid(), summary) if f.key == "importances"]
    (bars,) = figure.figure.data
    assert dict(zip(bars.y, bars.x, strict=True)) == summary["param_importance"]
