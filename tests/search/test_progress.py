"""ProgressCallback: one updating line on a terminal, a line every few trials elsewhere."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

from raysearch.search.tune import progress as progress_module
from raysearch.search.tune.progress import ProgressCallback


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_a_line_every_few_trials_and_a_last_one():
    out = io.StringIO()
    progress = ProgressCallback(out, metric="L2", higher_is_better=False, total=5, every=2)
    for metric in [0.3, 0.1, None, 0.2, 0.05]:
        progress.trial_finished("ok" if metric is not None else "failed", metric, metric == 0.05)
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # after trials 2 and 4, and the final one
    assert lines[-1].startswith("trials 5/5 done, 0 running, 1 failed | candidates 1")
    assert "best L2 0.05" in lines[-1]


def test_a_terminal_line_is_redrawn_in_place():
    out = Terminal()
    progress = ProgressCallback(out, metric="cos", higher_is_better=True)
    trial = SimpleNamespace(trial_id="a")
    progress.on_trial_start(iteration=0, trials=[], trial=trial)
    progress.on_trial_result(
        iteration=0,
        trials=[],
        trial=trial,
        result={"metric": 0.99, "trial": {"status": "ok", "is_candidate": True}},
    )
    progress.close()
    text = out.getvalue()
    assert text.startswith("\r\033[K") and text.endswith("\n")
    assert "\n" not in text[:-1]  # one line, redrawn
    assert "trials 1 done, 0 running, 0 failed | candidates 1 | best cos 0.99" in text


def test_without_a_stream_it_logs(caplog):
    progress = ProgressCallback(None, every=1)
    with caplog.at_level(logging.INFO, logger="raysearch.progress"):
        progress.trial_finished("ok", 1.0, False)
    assert "trials 1 done" in caplog.text


def _start(progress: ProgressCallback, trial_id: str) -> None:
    progress.on_trial_start(iteration=0, trials=[], trial=SimpleNamespace(trial_id=trial_id))


def _finish(progress: ProgressCallback, trial_id: str, metric: float) -> None:
    progress.on_trial_result(
        iteration=0,
        trials=[],
        trial=SimpleNamespace(trial_id=trial_id),
        result={"metric": metric, "done": True, "trial": {"status": "ok"}},
    )


def test_a_pipe_counts_the_trials_running_in_every_slot(monkeypatch):
    """Two slots, a line every two trials: each finish frees a slot a moment before Tune
    fills it again, and the line waits for that (it read "1 running" while two ran)."""
    out = io.StringIO()
    progress = ProgressCallback(out, metric="top1", higher_is_better=True, every=2)
    _start(progress, "a")
    _start(progress, "b")
    monkeypatch.setattr(progress_module, "SETTLE_S", 0.0)
    progress.on_step_end(iteration=0, trials=[])  # the wave started: the first line
    monkeypatch.setattr(progress_module, "SETTLE_S", 60.0)
    _finish(progress, "a", 0.9)
    _start(progress, "c")
    _finish(progress, "b", 0.95)
    assert out.getvalue().count("\n") == 1  # due, but slot b is not taken again yet
    _start(progress, "d")
    _finish(progress, "c", 0.97)
    _start(progress, "e")
    _finish(progress, "d", 0.91)
    progress.on_step_end(iteration=0, trials=[])
    _start(progress, "f")
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "trials 0 done, 2 running, 0 failed",
        "trials 2 done, 2 running, 0 failed",
        "trials 4 done, 2 running, 0 failed",
    ]


def test_a_line_that_no_trial_refills_is_written_once_the_count_settles(monkeypatch):
    out = io.StringIO()
    progress = ProgressCallback(out, metric="top1", higher_is_better=True, every=1)
    _start(progress, "a")
    _start(progress, "b")
    monkeypatch.setattr(progress_module, "SETTLE_S", 60.0)
    _finish(progress, "a", 0.9)  # the strategy waits for b's result: nothing starts
    assert out.getvalue() == ""
    monkeypatch.setattr(progress_module, "SETTLE_S", 0.0)
    progress.on_step_end(iteration=0, trials=[])
    assert out.getvalue().startswith("trials 1 done, 1 running, 0 failed")


def test_autosearch_run_shows_progress_unless_asked_not_to(tmp_path, monkeypatch, capsys):
    """From Python a search draws its progress line on standard error by default (a 100-second
    search was silent); ``progress=False`` keeps it to ``auto_search.log``."""
    from raysearch.config import SearchConfig
    from raysearch.search import runner

    given = []

    class Execution:
        def __init__(self, config, folder) -> None:
            pass

        def execute(self, *, resume, progress, prepared, started_at=None):
            given.append(progress)
            if progress is not None:
                progress.write("trials 0 done\n")

    monkeypatch.setattr(runner, "Execution", Execution)
    monkeypatch.setattr(runner, "_preflight_beside_ray", lambda config, **kw: None)
    monkeypatch.setattr(runner, "check_resources", lambda config: None)
    config = SearchConfig.from_dict(
        {
            "model": "m.onnx",
            "calibration_data": "c.npz",
            "search_space": {"calibrate_method": ["MinMax"]},
            "output_dir": str(tmp_path / "out"),
        },
        check_paths=False,
    )
    runner.AutoSearch(config).run(overwrite=True)
    assert "trials 0 done" in capsys.readouterr().err
    runner.AutoSearch(config).run(overwrite=True, progress=False)
    assert given[-1] is None and capsys.readouterr().err == ""


def test_a_sensitivity_probe_is_never_the_lines_best_nor_a_candidate():
    """Issue 58 item 7: a probe (one node quantized, every other float) scores far better than
    the settings searched; the line's best is the best of those, as best/ is."""
    out = io.StringIO()
    progress = ProgressCallback(out, metric="kl", higher_is_better=False, every=1)
    for trial_id, metric, stage in (("a", 0.0015, "blocks"), ("b", 0.0006, "sensitivity")):
        trial = SimpleNamespace(trial_id=trial_id)
        progress.on_trial_start(iteration=0, trials=[], trial=trial)
        # as the trainable reports it: a probe is never a candidate
        record = {"status": "ok", "is_candidate": stage != "sensitivity", "stage": stage}
        progress.on_trial_result(
            iteration=0, trials=[], trial=trial, result={"metric": metric, "trial": record}
        )
    progress.close()
    assert out.getvalue().splitlines()[-1].startswith(
        "trials 2 done, 0 running, 0 failed | candidates 1 | best kl 0.0015 |"
    )
