"""results.parquet for pandas: list settings as Arrow lists, ``SearchResult.dataframe()`` and
``raysearch show --csv``."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from raysearch.cli import main
from raysearch.outputs import results_table
from raysearch.outputs._table import write_parquet
from raysearch.search._result import SearchResult, results_dataframe
from raysearch.trialrecord import TrialRecord

RECORDS = [
    TrialRecord.from_dict(r)
    for r in [
        {
            "trial_id": "t1",
            "number": 1,
            "status": "ok",
            "metric": 0.5,
            "is_candidate": True,
            "params": {"nodes_to_exclude": ["/a/MatMul", "/b/MatMul"], "per_channel": True},
        },
        {
            "trial_id": "t2",
            "number": 2,
            "status": "ok",
            "metric": 0.25,
            "is_candidate": False,
            "params": {"nodes_to_exclude": [], "per_channel": False},
        },
        {"trial_id": "t3", "number": 3, "status": "failed", "error": "boom", "params": {}},
    ]
]


def test_list_settings_are_arrow_lists_in_the_parquet_file(tmp_path):
    write_parquet(results_table(RECORDS), tmp_path / "results.parquet")
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.schema.field("params/nodes_to_exclude").type == pa.list_(pa.string())
    assert table.column("params/nodes_to_exclude").to_pylist() == [
        ["/a/MatMul", "/b/MatMul"],
        [],
        None,
    ]


def test_the_dataframe_holds_python_lists_and_numbers(tmp_path):
    write_parquet(results_table(RECORDS), tmp_path / "results.parquet")
    result = SearchResult(
        best_params=None,
        best_metric=None,
        candidates=[],
        summary={},
        results=pq.read_table(tmp_path / "results.parquet"),
        output_dir=tmp_path,
    )
    df = result.dataframe()
    cells = df["params/nodes_to_exclude"].tolist()
    assert cells[:2] == [["/a/MatMul", "/b/MatMul"], []] and cells[2] is None
    assert all(type(c) is list for c in cells[:2])
    assert df["metric"].dtype == "float64" and df["is_candidate"].tolist() == [True, False, False]
    # A table an older search wrote (lists as JSON text) reads back the same.
    old = pa.table({"params/nodes_to_exclude": [json.dumps(["/a/MatMul"]), None]})
    assert results_dataframe(old)["params/nodes_to_exclude"].tolist() == [["/a/MatMul"], None]


def test_show_csv_prints_every_trial(tmp_path, capsys):
    write_parquet(results_table(RECORDS), tmp_path / "results.parquet")
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "space_exhausted"}))
    assert main(["show", str(tmp_path), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["trial_id"] for r in rows] == ["t1", "t2", "t3"]
    assert json.loads(rows[0]["params/nodes_to_exclude"]) == ["/a/MatMul", "/b/MatMul"]
    assert rows[0]["is_candidate"] == "true" and rows[2]["metric"] == ""


def test_the_readme_schema_names_every_column_of_results_parquet():
    """README's table of ``results.parquet``: each fixed column with its Arrow type."""
    import re
    from pathlib import Path

    from raysearch.outputs import RESULT_COLUMNS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### `results.parquet`", 1)[1].split("\n### ", 1)[0]
    documented: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            names = re.findall(r"`([^`]+)`", cells[0])
            types = [t.strip() for t in cells[1].split(",")]
            for i, name in enumerate(names):
                documented[name] = types[min(i, len(types) - 1)].split(";")[0].split()
    missing = [c for c in RESULT_COLUMNS if c not in documented]
    assert not missing, f"README's results.parquet schema lacks {missing}"
    for name, dtype in RESULT_COLUMNS.items():
        arrow_name = {"double": "float64"}.get(str(dtype), str(dtype))
        assert documented[name][0] == arrow_name, (name, documented[name])


def test_a_search_result_reads_results_parquet_without_arrows_dataset_api(tmp_path):
    """The result is built after the last trial, before the command ends: reading the one file
    imports nothing of Arrow's dataset API (pyarrow.dataset, Acero), which takes longer than
    the read. In a fresh interpreter, as the command's driver is."""
    import subprocess
    import sys

    write_parquet(results_table(RECORDS), tmp_path / "results.parquet")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from raysearch.search._result import build_result\n"
        f"result = build_result(Path({str(tmp_path)!r}), {{}}, [], True)\n"
        "print(result.results.num_rows, 'pyarrow.dataset' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["3", "False"]
