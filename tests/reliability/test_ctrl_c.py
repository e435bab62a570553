"""Ctrl-C stops a test run: pytest, run as a terminal runs it, gets SIGINT (its whole
process group, as a terminal sends it) during an in-process search that follows another
one; it ends as interrupted, runs no further test, and leaves no process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import (
    REPO,
    journal,
    kill_group,
    session_processes,
    stop_leftovers,
    subprocess_env,
    wait_until,
)

pytestmark = pytest.mark.slow

RUN = Path(__file__).with_name("interrupted_run.py")
#: How long an interrupted run may take to end and take its Ray down (seconds): Ray's
#: shutdown on a loaded 2-core machine takes a few; the run it interrupts takes minutes.
ENDS_WITHIN_S = 120


def test_ctrl_c_stops_the_test_run_and_leaves_nothing_behind(tmp_path: Path):
    mark = tmp_path / "mark"
    with open(tmp_path / "output.txt", "w") as output:
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", str(RUN), "-q", "-p", "no:randomly",
             "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}"],
            cwd=REPO,
            env=subprocess_env(INTERRUPTED_RUN_MARK=str(mark)),
            start_new_session=True,  # a terminal's foreground group, led by pytest
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(run, lambda: mark.exists() and len(journal(Path(mark.read_text()))) >= 1, 300)
        kill_group(run, signal.SIGINT)
        try:
            status = run.wait(timeout=ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the test run still runs {ENDS_WITHIN_S} s after Ctrl-C")
        text = (tmp_path / "output.txt").read_text()
        assert status == pytest.ExitCode.INTERRUPTED, text[-3000:]
        assert not mark.with_suffix(".after").exists(), text[-3000:]
        deadline = time.monotonic() + ENDS_WITHIN_S
        while (left := session_processes(run.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"left behind by the interrupted run: {left}"
    finally:
        stop_leftovers(run)
