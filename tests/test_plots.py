"""``plots/``: each legend entry in the colour of what it names, and parameter importances
only from ten scored trials on (as ``report.html``), with their number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from raysearch.config import SearchConfig
from raysearch.outputs import _plots
from raysearch.trialrecord import TrialRecord


def _row(i: int, metric: float, **extra) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{i}",
        status="ok",
        metric=metric,
        is_candidate=metric < 0.05,
        params={"calibrate_method": ["MinMax", "Percentile"][i % 2], "per_channel": i % 3 == 0},
        **extra,
    )


@pytest.fixture
def figures(monkeypatch) -> list:
    saved: list = []
    monkeypatch.setattr(_plots, "_save_figure", lambda fig, path: saved.append(fig))
    return saved


def test_each_legend_entry_has_the_colour_of_its_points(figures, tmp_path):
    rows = [_row(1, 0.01), _row(2, 0.2), _row(3, 0.4, stopped_at_rung=0)]
    _plots._plot_metric(rows, tmp_path / "m.png", "L2", 0.05, False, None)
    (ax,) = figures[0].axes
    legend = {
        t.get_text(): h
        for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles, strict=True)
    }
    points = {c.get_label(): c for c in ax.collections}
    for label in ("candidate", "not a candidate", "stopped at a rung (metric over some rows)"):
        (colour,) = {tuple(c) for c in points[label].get_facecolor()}
        assert tuple(legend[label].get_facecolor()[0]) == colour, label
    assert to_rgba("tab:green") == tuple(points["candidate"].get_facecolor()[0])


def test_importances_only_from_ten_scored_trials_with_their_number(figures, tmp_path):
    config = SearchConfig.from_dict(
        {
            "model": "m.onnx",
            "calibration_data": "c.npz",
            "search_space": {"calibrate_method": ["MinMax", "Percentile"]},
            "metric": "L2",
            "tolerance": 0.05,
            "output_dir": str(tmp_path),
        },
        check_paths=False,
    )
    metrics = np.linspace(0.01, 0.3, 12)
    failed = [_row(30 + i, 0.5).replace(status="failed", metric=None) for i in range(3)]
    few = [_row(i, float(m)) for i, m in enumerate(metrics[:9])] + failed
    summary: dict = {}
    _plots.write_plots(few, Path(tmp_path), config, None, summary)
    assert summary["param_importance"] is None and summary["param_importance_trials"] == 9
    assert len(figures) == 1  # the metric per trial only

    # A trial stopped at a rung counts, with its score over the rows it reached.
    stopped = [_row(20 + i, 0.5, stopped_at_rung=0) for i in range(5)]
    enough = [_row(i, float(m)) for i, m in enumerate(metrics[:9])] + stopped + failed
    _plots.write_plots(enough, Path(tmp_path), config, None, summary)
    assert summary["param_importance_trials"] == 14
    assert summary["param_importance_stopped"] == 5
    assert set(summary["param_importance"]) <= {"calibrate_method", "per_channel"}
    title = figures[-1].axes[0].get_title()
    assert title.endswith(
        "(14 trials: 9 complete, 5 stopped at a rung with their scores over the rows they reached)"
    )
