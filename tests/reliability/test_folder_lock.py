"""Two searches into one output folder: while ``raysearch run`` runs there, a second ``run``
(with or without ``--overwrite``) and a ``resume`` are refused with one line and touch
nothing; once the running search is killed its lock is gone and ``resume`` completes it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from raysearch.cli import main
from tests.reliability.helpers import (
    journal,
    kill_group,
    probe_config,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def test_a_second_search_in_a_running_searchs_folder_is_refused(tmp_path: Path, capsys):
    config = probe_config(tmp_path, stop={"iteration_limit": 12}, plan={"sleep_s": 0.6})
    path = write_config(tmp_path / "config.yaml", config)
    out = Path(config["output_dir"])
    proc = start_raysearch(["run", str(path)], tmp_path)
    try:
        wait_until(proc, lambda: len(journal(out)) >= 2)
        before = {r["trial_id"] for r in journal(out)}
        for command in (
            ["run", str(path)],
            ["run", str(path), "--overwrite"],
            ["resume", str(out)],
        ):
            assert main(command) == 2, command
            err = capsys.readouterr().err.strip()
            assert "in use by a running search" in err and "\n" not in err, err
        # Nothing of the running search was removed by the refused overwrite.
        assert before <= {r["trial_id"] for r in journal(out)}
        assert proc.poll() is None
        kill_group(proc, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)
    killed_at = {r["trial_id"] for r in journal(out)}
    assert len(killed_at) < 12

    assert main(["resume", str(out)]) == 0
    rows = journal(out)
    assert len(rows) == len({r["trial_id"] for r in rows}) == 12
    assert killed_at <= {r["trial_id"] for r in rows}
