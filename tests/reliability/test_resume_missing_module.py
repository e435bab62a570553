"""A resume whose saved Tune state names a module that cannot be imported (a plugin's module
not installed, or not there yet) stops with one line naming it (exit 2) instead of taking the
state for a file cut short by a kill; once the module is back the same resume goes on from
Tune's saved experiment with nothing run again."""

from __future__ import annotations

import signal
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.reliability.helpers import (
    calls,
    journal,
    kill_group,
    probe_config,
    run_raysearch,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.slow

#: A strategy plugin whose phase imports its ordering from a submodule when it starts (as a
#: plugin defers a heavy import): Tune's saved searcher then names ``resumeplug.order``.
PLUGIN = {
    "__init__.py": '''
        from raysearch.space import expand_spaces
        from raysearch.strategies import EXHAUSTED, Phase, Proposal, register_strategy


        class InOrder(Phase):
            """Every setting of the grid once, in the order ``resumeplug.order`` gives."""

            def __init__(self, context):
                self.spaces = list(context.spaces)
                self.items = []
                self.order = None

            def start(self, context):
                from resumeplug.order import Order

                self.order = Order()
                grid = expand_spaces(context.spaces, context.reject)
                self.items = self.order.sorted(list(zip(grid.space_index, grid.points)))

            def propose(self, trial_id, search):
                while self.items:
                    index, point = self.items.pop(0)
                    proposal = Proposal.of(self.spaces[index], index, point)
                    if proposal.key not in search.known_keys:
                        return proposal
                return EXHAUSTED


        @register_strategy("InOrder")
        def build(context):
            return [InOrder(context)]
        ''',
    "order.py": """
        class Order:
            def sorted(self, items):
                return list(items)
        """,
}
SETTINGS = 8


def test_a_resume_missing_a_plugin_module_stops_naming_it_then_goes_on(tmp_path: Path):
    package = tmp_path / "resumeplug"
    package.mkdir()
    for name, text in PLUGIN.items():
        (package / name).write_text(textwrap.dedent(text))
    config = probe_config(
        tmp_path,
        search_algo="InOrder",
        plugins=["resumeplug"],
        search_space={
            "calibrate_method": ["MinMax", "Percentile"],
            "per_channel": [True, False],
            "reduce_range": [False, True],
        },
        resources={"max_concurrent_trials": 1},
        plan={"sleep_s": 0.3},
    )
    path = write_config(tmp_path / "config.yaml", config)
    out = tmp_path / "out"
    proc = start_raysearch(["run", str(path)], tmp_path)
    try:
        wait_until(proc, lambda: len(journal(out)) >= 2)
        kill_group(proc, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "stderr.txt").read_text()
    finally:
        stop_leftovers(proc)
    before = journal(out)
    assert 2 <= len(before) < SETTINGS

    (package / "order.py").rename(tmp_path / "order.py")
    stopped = run_raysearch(["resume", str(out)], tmp_path, timeout=300)
    experiment = out / "ray_results" / "search"
    saved = sorted(p.name for p in experiment.glob("searcher-state-*.pkl"))[-1]
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"raysearch: error: {experiment}: Ray Tune's saved state {saved} needs the module"
        " 'resumeplug.order', which cannot be imported here (No module named"
        " 'resumeplug.order'); make it importable (install it, or put it beside the config)"
        " and resume again"
    )
    assert journal(out) == before  # nothing ran

    (tmp_path / "order.py").rename(package / "order.py")
    resumed = run_raysearch(["resume", str(out)], tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = journal(out)
    assert after[: len(before)] == before
    assert len({r["key"] for r in after}) == len(after) == SETTINGS
    assert "restoring Ray Tune's experiment" in (out / "auto_search.log").read_text()
    evaluations = Counter(c["trial"] for c in calls(tmp_path / "calls.jsonl"))
    assert all(evaluations[r["trial_id"]] == 1 for r in before), evaluations
