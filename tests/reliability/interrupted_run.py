"""A slow test run for ``test_ctrl_c``, which runs this module (named so that the suite does
not collect it) with pytest in a terminal-like session and sends it Ctrl-C (SIGINT) during
its second search: an in-process search, as most end-to-end tests run one, after another
search that ran to its end. ``INTERRUPTED_RUN_MARK`` names the file each test touches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.reliability.helpers import probe_config

pytestmark = pytest.mark.usefixtures("ray_cluster")

MARK = Path(os.environ.get("INTERRUPTED_RUN_MARK", os.devnull))


def test_a_search_that_runs_to_its_end(tmp_path):
    from raysearch.search import AutoSearch

    config = probe_config(tmp_path, search_space={"per_channel": [True]})
    assert AutoSearch(config).run().summary["n_trials"] == 1


def test_a_long_search(tmp_path):
    from raysearch.search import AutoSearch

    # 24 settings of 1 s each on the session's one CPU: 24 s or more; Ctrl-C comes after the
    # first.
    config = probe_config(tmp_path, plan={"sleep_s": 1})
    MARK.write_text(str(tmp_path / "out"))
    AutoSearch(config).run()


def test_after_the_interrupt():
    MARK.with_suffix(".after").write_text("the run went on after Ctrl-C")
