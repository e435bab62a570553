"""What ``max_failures`` retries, as the README's config says: a trial whose process failed
(it crashed, ran out of memory or timed out) is run again, up to ``max_failures`` times, in a
new process; a setting that raises is a failed trial at once, never retried. One search with
``max_failures: 1`` serves every test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from raysearch.search import AutoSearch
from tests.reliability.helpers import REPO, calls, probe_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

SPACE = {
    "nodes_to_exclude": [["fc1"], ["fc2"], ["fc1", "fc2"]],
    "activation_type": ["QUInt8", "QInt8"],
}
FAULTS = {
    "fc1/uint8": "raise",  # an ordinary exception of the setting
    "fc2/uint8": "memory",  # MemoryError: the process is replaced
    "fc2/int8": "hang",  # trial_timeout_s
}
#: Crashes (segmentation faults): once, then fine when retried; and every time.
CRASHES = {"fc1+fc2/uint8": "segv_once", "fc1+fc2/int8": "segv"}


def _signature(row: dict[str, Any]) -> str:
    excluded = row["params/nodes_to_exclude"]
    names = "+".join(sorted(json.loads(excluded) if isinstance(excluded, str) else excluded))
    return f"{names}/{ {'QUInt8': 'uint8', 'QInt8': 'int8'}[row['params/activation_type']] }"


@pytest.fixture(scope="module")
def retried(ray_cluster, tmp_path_factory) -> dict[str, Any]:
    """The search of :data:`SPACE` with :data:`FAULTS` and :data:`CRASHES` and
    ``max_failures: 1``: its result, each setting's row by signature, the evaluator's calls."""
    folder = tmp_path_factory.mktemp("max_failures")
    config = probe_config(
        folder,
        search_space=SPACE,
        faults={**FAULTS, **CRASHES},
        plan={"hang_s": 300},
        trial_timeout_s=8,
        max_failures=1,
    )
    result = AutoSearch(config).run()
    rows = {_signature(r): r for r in result.results.to_pylist()}
    return {"result": result, "rows": rows, "calls": calls(folder / "calls.jsonl")}


def test_max_failures_retries_failed_processes_never_a_setting_that_raises(retried):
    rows, log = retried["rows"], retried["calls"]
    runs = {sig: sum(c["sig"] == sig for c in log) for sig in FAULTS}
    assert runs == {"fc1/uint8": 1, "fc2/uint8": 2, "fc2/int8": 2}
    assert all(rows[sig]["status"] == "failed" for sig in FAULTS)
    assert rows["fc1/int8"]["status"] == "ok"
    assert rows["fc1/uint8"]["error"].endswith("injected failure for fc1/uint8")
    # The README's config says the same.
    readme = (REPO / "README.md").read_text()
    assert (
        "max_failures: 0                # retries of a trial whose process failed: it crashed, ran"
        " out\n                               # of memory or timed out (trial_timeout_s); a trial"
        " lost with its\n                               # node runs again besides (up to 3 times),"
        " and a setting that\n                               # raises is a failed trial at once,"
        " never retried\n"
    ) in readme


def test_max_failures_retries_a_crashed_trial(retried):
    rows, log = retried["rows"], retried["calls"]
    once = [c for c in log if c["sig"] == "fc1+fc2/uint8"]
    always = [c for c in log if c["sig"] == "fc1+fc2/int8"]
    # Crashed once, retried in a new process, then succeeded: one trial, two runs.
    assert len(once) == 2 and once[0]["trial"] == once[1]["trial"]
    assert once[0]["pid"] != once[1]["pid"]
    assert rows["fc1+fc2/uint8"]["status"] == "ok" and rows["fc1+fc2/uint8"]["metric"] is not None
    # Crashing every time: retried once, then recorded as failed.
    assert len(always) == 2 and rows["fc1+fc2/int8"]["status"] == "failed"
    assert "Segmentation fault" in rows["fc1+fc2/int8"]["error"]
    summary = retried["result"].summary
    assert summary["n_trials"] == len(SPACE["nodes_to_exclude"]) * 2 == 6
    assert summary["n_failed"] == len(FAULTS) + 1
