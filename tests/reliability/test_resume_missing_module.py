"""A resume whose strategy plugin needs a module that cannot be imported (a plugin's submodule
not installed, or not there yet) is refused before Ray starts, with one line naming the module
(exit 2), and leaves the output folder as it was; once the module is back the same resume goes
on with nothing run again. The last resume also shows the command ending the Ray
it started for itself: shut down from the end of the trials on, nothing of it left running."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.helpers import (
    calls,
    interrupt_after,
    journal,
    probe_config,
    run_and_find_leftovers,
    run_raysearch,
    write_config,
)

pytestmark = pytest.mark.slow

#: A strategy plugin whose phase imports its ordering from a submodule when it starts (as a
#: plugin defers a heavy import): the config's ``plugins`` import ``resumeplug`` alone; the
#: interrupted session records ``resumeplug.order`` among the modules it imported (the marker's
#: ``plugin_imports``), which the resume imports before Ray starts.
PLUGIN = {
    "__init__.py": '''
        from raysearch.plugins import EXHAUSTED, Phase, Proposal, expand_spaces, register_strategy


        class InOrder(Phase):
            """Every setting of the grid once, in the order ``resumeplug.order`` gives."""

            def __init__(self, context):
                self.spaces = list(context.spaces)
                self.items = []

            def start(self, context):
                from resumeplug.order import Order

                grid = expand_spaces(context.spaces, context.reject)
                self.items = Order().sorted(list(zip(grid.space_index, grid.points)))

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
#: The files of a search the refused resume must leave byte for byte as they were.
KEPT = ("journal.jsonl", "summary.json", "results.parquet", "report.html", "config.yaml")


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in KEPT if (out / name).is_file()}


def _trials_evaluated(folder: Path) -> int:
    """The probe evaluator's calls for trials (each session's preflight scores the float model
    too)."""
    return sum(1 for c in calls(folder / "calls.jsonl") if c["trial"] != "float")


def _marker(out: Path) -> dict[str, Any]:
    state = json.loads((out / ".raysearch.json").read_text())
    return {key: state.get(key) for key in ("status", "sessions", "search_id")}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict[str, Any]:
    """A search of the ``InOrder`` plugin interrupted after two trials, resumed without
    ``resumeplug/order.py``, then resumed again with it back."""
    folder = tmp_path_factory.mktemp("missing_module")
    package = folder / "resumeplug"
    package.mkdir()
    for name, text in PLUGIN.items():
        (package / name).write_text(textwrap.dedent(text))
    config = probe_config(
        folder,
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
    path = write_config(folder / "config.yaml", config)
    out = folder / "out"
    interrupted = interrupt_after(["run", str(path)], folder, out, 2, signal.SIGINT)
    before = {"journal": journal(out), "files": _files(out), "marker": _marker(out)}
    evaluated = _trials_evaluated(folder)

    (package / "order.py").rename(folder / "order.py")
    # Ray's temp folder of its own (short: Ray's socket paths are limited to 107 characters).
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs-mm-"))
    try:
        refused = run_raysearch(["resume", str(out)], folder, timeout=300, RAY_TMPDIR=str(ray_tmp))
        ray_files = sorted(str(p.relative_to(ray_tmp)) for p in ray_tmp.rglob("*"))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    after_refusal = {"journal": journal(out), "files": _files(out), "marker": _marker(out)}
    evaluated_refused = _trials_evaluated(folder) - evaluated

    (folder / "order.py").rename(package / "order.py")
    status, left = run_and_find_leftovers(["resume", str(out)], folder)
    return {
        "folder": folder,
        "out": out,
        "interrupted": interrupted,
        "before": before,
        "refused": refused,
        "ray_files": ray_files,
        "after_refusal": after_refusal,
        "evaluated_refused": evaluated_refused,
        "status": status,
        "stderr": (folder / "stderr.txt").read_text(),
        "left": left,
    }


def test_a_resume_missing_a_plugin_module_is_refused_in_one_line(resumed):
    assert resumed["interrupted"] == 130
    before = resumed["before"]
    assert 2 <= len(before["journal"]) < SETTINGS
    refused = resumed["refused"]
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"raysearch: error: {resumed['out']}: the search strategy InOrder needs the module "
        "'resumeplug.order', which cannot be imported here (No module named "
        "'resumeplug.order'); make it importable (install it, or put it beside the config) "
        "and resume again"
    )
    # Refused before Ray started (nothing in its temp folder), before any trial ran, and the
    # folder is as the interrupted search left it.
    assert resumed["ray_files"] == []
    assert resumed["evaluated_refused"] == 0
    assert resumed["after_refusal"] == before


def test_with_the_module_back_the_resume_goes_on_with_nothing_run_again(resumed):
    assert resumed["status"] == 0, resumed["stderr"][-3000:]
    before = resumed["before"]["journal"]
    after = journal(resumed["out"])
    assert after[: len(before)] == before
    assert len({r["key"] for r in after}) == len(after) == SETTINGS
    evaluations = Counter(c["trial"] for c in calls(resumed["folder"] / "calls.jsonl"))
    assert all(evaluations[r["trial_id"]] == 1 for r in before), evaluations
    summary = json.loads((resumed["out"] / "summary.json").read_text())
    assert summary["n_trials"] == SETTINGS and summary["sessions"] == 2


def test_the_command_shuts_its_own_ray_down_from_the_end_of_the_trials(resumed):
    log = (resumed["out"] / "auto_search.log").read_text().splitlines()
    session = log[max(i for i, line in enumerate(log) if "resuming search in" in line) :]
    shut = [i for i, line in enumerate(session) if "the search's own Ray shuts down" in line]
    ended = [i for i, line in enumerate(session) if "search ended (" in line]
    # Once, after the last trial and before the outputs are written.
    assert len(shut) == 1 and len(ended) == 1 and shut[0] < ended[0], session[-12:]
    assert resumed["left"] == {}, resumed["left"]
