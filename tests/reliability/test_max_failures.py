"""What ``max_failures`` retries, as the README's config says: a trial whose process failed
(it ran out of memory or timed out; a crash: ``test_faults.py``) is run again, up to
``max_failures`` times; a setting that raises is a failed trial at once, never retried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raysearch.search import AutoSearch
from tests.reliability.helpers import REPO, calls, probe_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

SPACE = {"nodes_to_exclude": [["fc1"], ["fc2"]], "activation_type": ["QUInt8", "QInt8"]}
FAULTS = {
    "fc1/uint8": "raise",  # an ordinary exception of the setting
    "fc2/uint8": "memory",  # MemoryError: the process is replaced
    "fc2/int8": "hang",  # trial_timeout_s
}


def _signature(row: dict[str, Any]) -> str:
    excluded = row["params/nodes_to_exclude"]
    names = "+".join(sorted(json.loads(excluded) if isinstance(excluded, str) else excluded))
    return f"{names}/{ {'QUInt8': 'uint8', 'QInt8': 'int8'}[row['params/activation_type']] }"


def test_max_failures_retries_failed_processes_never_a_setting_that_raises(tmp_path: Path):
    config = probe_config(
        tmp_path,
        search_space=SPACE,
        faults=FAULTS,
        plan={"hang_s": 300},
        trial_timeout_s=8,
        max_failures=1,
    )
    result = AutoSearch(config).run()
    rows = {_signature(r): r for r in result.results.to_pylist()}
    runs = {sig: sum(c["sig"] == sig for c in calls(tmp_path / "calls.jsonl")) for sig in FAULTS}
    assert runs == {"fc1/uint8": 1, "fc2/uint8": 2, "fc2/int8": 2}
    assert all(rows[sig]["status"] == "failed" for sig in FAULTS)
    assert rows["fc1/int8"]["status"] == "ok"  # (a crash is retried too: test_faults.py)
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
