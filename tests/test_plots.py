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
    _plots._write_figure(_plots._metric_spec(rows, "L2", 0.05, False, None), tmp_path / "m.png")
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


def _config(tmp_path) -> SearchConfig:
    """An L2 search of two calibration methods writing into ``tmp_path``."""
    return SearchConfig.from_dict(
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


def test_importances_only_from_ten_scored_trials_with_their_number(figures, tmp_path):
    config = _config(tmp_path)
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


def _specs(tmp_path) -> dict:
    config = _config(tmp_path)
    rows = [_row(i, float(m)) for i, m in enumerate(np.linspace(0.01, 0.3, 12))]
    return _plots.plot_job(rows, config, None, {})


def test_the_plot_process_draws_the_pngs_the_driver_would_and_the_driver_writes_them(tmp_path):
    """The ``raysearch`` command's plots are drawn in a process of their own (matplotlib holds
    the driver's interpreter lock while it draws, so a thread would draw after the report,
    not beside it): the same PNGs, byte for byte, as the driver draws."""
    from raysearch.outputs import PlotProcess
    from raysearch.outputs._plot_render import render

    specs = _specs(tmp_path)
    assert set(specs) == {"metric_per_trial.png", "param_importance.png"}
    plots = PlotProcess()
    plots.start()
    plots.draw(specs)
    process = plots._process
    assert not (tmp_path / "plots").exists()  # drawn meanwhile, written by wait()
    plots.wait(tmp_path)
    assert process.returncode == 0 and not plots.started
    written = {p.name: p.read_bytes() for p in (tmp_path / "plots").iterdir()}
    assert written == render(specs)


def test_a_plot_process_without_an_answer_leaves_the_plots_to_the_driver(tmp_path, caplog):
    from raysearch.outputs import PlotProcess

    specs = _specs(tmp_path)
    plots = PlotProcess()
    plots.start()
    plots._process.kill()
    plots._process.wait()
    with caplog.at_level("WARNING", logger="raysearch.outputs"):
        plots.draw(specs)
        plots.wait(tmp_path)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("the plot process failed (") and "plots/ drawn by the driver" in line
    assert {p.name for p in (tmp_path / "plots").iterdir()} == set(specs)


def test_a_plot_process_whose_driver_stopped_reading_ends_quietly(tmp_path, capfd):
    """A driver that ends (or fails) between handing the plots over and reading them closes
    the pipe: the process ends without a traceback on the terminal it shares."""
    from raysearch.outputs import PlotProcess

    plots = PlotProcess()
    plots.draw(_specs(tmp_path))
    process = plots._process
    process.stdout.close()
    assert process.wait(timeout=120) == 0
    assert "Error" not in capfd.readouterr().err
