"""``batch_report.html``'s models table from the batch's rows and each search's
``summary.json`` (no Ray; the batch that writes it is tests/test_batch.py): a built-in metric's
float value (the float model against itself) and drop are filled, the best setting reads as
``name = value`` (null ``op_types_to_quantize``: every op), sizes in human units (issue 48
item 7)."""

from __future__ import annotations

import html
import json
import re

from raysearch.outputs import build_batch_report


def _cells(text: str) -> dict[str, dict[str, str]]:
    table = text.split('<table id="trials"', 1)[1].split("</table>", 1)[0]
    rows = [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c))
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r)
        ]
        for r in re.findall(r"<tr[^>]*>(.*?)</tr>", table)
    ]
    head = rows[0]
    return {row[0]: dict(zip(head, row)) for row in rows[1:]}


def test_a_builtin_metrics_float_value_and_drop_and_the_best_setting_in_words(tmp_path):
    (tmp_path / "mlp").mkdir()
    summary = {
        "metric": "cos",
        "higher_is_better": True,
        "float_metric": None,  # a built-in metric never scores the float model
        "best_params": {"per_channel": True, "op_types_to_quantize": None},
        "best_model_size_bytes": 839889,
        "float_model_size_bytes": 3163737,
        "best_latency_ms": 167.95,
        "float_latency_ms": 125.5,
    }
    (tmp_path / "mlp" / "summary.json").write_text(json.dumps(summary))
    row = {
        "name": "mlp",
        "status": "ok",
        "error": None,
        "float_metric": None,
        "best_metric": 0.9975,
        "n_candidates": 2,
        "n_trials": 4,
        "n_failed": 0,
        "wall_time_s": 12.5,
        "stop_reason": "space_exhausted",
    }
    cells = _cells(build_batch_report(tmp_path, [row], {}))["mlp"]
    assert cells["float metric"] == "1"
    assert cells["drop"] == "0.0025"
    assert cells["best setting / error"] == "per_channel = yes, op_types_to_quantize = every op"
    assert cells["size"] == "840 kB / 3.16 MB"
    assert cells["latency (ms)"] == "167.95 / 125.5"
