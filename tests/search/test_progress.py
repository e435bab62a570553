"""ProgressCallback: one updating line on a terminal, a line every few trials elsewhere."""

from __future__ import annotations

import io
import logging
import pickle
from types import SimpleNamespace

from raysearch.search import ProgressCallback


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


def test_without_a_stream_it_logs_and_it_pickles_without_its_stream(caplog):
    progress = ProgressCallback(None, every=1)
    with caplog.at_level(logging.INFO, logger="raysearch.progress"):
        progress.trial_finished("ok", 1.0, False)
    assert "trials 1 done" in caplog.text
    copy = pickle.loads(pickle.dumps(ProgressCallback(io.StringIO())))
    assert copy.stream is None
