"""Several objectives in a real search sampled by NSGA-II on all of them: pareto.parquet is
the brute-force non-dominated filter of results.parquet's candidates, select: size puts the
smallest candidate in best/, candidates/ holds the front's models, the journal (what resume
reads) gives that front, and its report.html renders offline in headless Chromium with its
Pareto front."""

from __future__ import annotations

import json
import math
from typing import Any

import optuna
import pyarrow.parquet as pq
import pytest

from raysearch.outputs import default_study_name, export_study
from raysearch.ranking import pareto_front
from raysearch.search import AutoSearch
from raysearch.search.record.journal import Journal
from raysearch.search.record.output_dir import search_id
from tests.test_report_browser import _offline_and_clean, _page, browser  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

SPACE = {
    "calibrate_method": ["MinMax", "Percentile"],
    "per_channel": [True, False],
    "op_types_to_quantize": [["MatMul", "Gemm"], ["MatMul"]],
}


def _brute_front(rows: list[dict]) -> set[str]:
    """Candidates no other candidate beats on every objective (L2, latency, size: all
    lower is better) and strictly on one, written out here independently of raysearch."""

    def values(r: dict) -> list[float]:
        return [
            r["metric"],
            math.inf if r["latency_ms"] is None else r["latency_ms"],
            r["model_size_bytes"] / 1e6,
        ]

    candidates = [r for r in rows if r["status"] == "ok" and r["is_candidate"]]
    front = set()
    for c in candidates:
        mine = values(c)
        if not any(
            all(o <= m for o, m in zip(values(d), mine))
            and any(o < m for o, m in zip(values(d), mine))
            for d in candidates
        ):
            front.add(c["trial_id"])
    return front


@pytest.fixture(scope="module")
def pareto_search(mlp_files, tmp_path_factory) -> tuple[Any, str]:
    """The search over three objectives (every setting a candidate), its live Optuna study in
    a SQLite storage: its result and the storage's URL."""
    folder = tmp_path_factory.mktemp("objectives")
    storage = f"sqlite:///{folder / 'live.db'}"
    config = {
        "model": str(mlp_files["model"]),
        "calibration_data": str(mlp_files["data"]),
        "search_space": SPACE,
        "metric": "L2",
        "tolerance": 10.0,  # L2 within 10: every setting is a candidate
        "seed": 0,
        "objectives": ["metric", "latency_ms", "model_size_mb"],
        "select": "size",
        "keep_candidates": 1,
        "search_algo": "NSGAII",  # samples on the three objectives until the space is done
        "optuna_storage": storage,
        "output_dir": str(folder / "out"),
    }
    return AutoSearch(config).run(), storage


def test_pareto_front_and_select_size(pareto_search, browser):  # noqa: F811
    result = pareto_search[0]
    out, summary = result.output_dir, result.summary
    results = pq.read_table(out / "results.parquet")
    pareto = pq.read_table(out / "pareto.parquet")
    rows = results.to_pylist()
    assert len(rows) == 8 and all(r["is_candidate"] for r in rows)
    assert len({r["model_size_bytes"] for r in rows}) > 1  # size tells settings apart
    assert all(r["latency_ms"] and r["extra/latency_batch_size"] >= 1 for r in rows)

    # pareto.parquet: the rows of results.parquet (its columns) of the brute-force front.
    front = _brute_front(rows)
    assert front and pareto.column_names == results.column_names
    assert pareto.to_pylist() == [r for r in rows if r["trial_id"] in front]
    assert summary["objectives"] == ["metric", "latency_ms", "model_size_mb"]
    assert summary["select"] == "size" and set(summary["pareto_trial_ids"]) == front
    stored = json.loads((out / "summary.json").read_text())
    assert stored["pareto_trial_ids"] == summary["pareto_trial_ids"]

    # best/: the smallest candidate (ties by the metric), its model the candidate's file.
    smallest = min(r["model_size_bytes"] for r in rows)
    expected = min(
        (r for r in rows if r["model_size_bytes"] == smallest), key=lambda r: r["metric"]
    )
    assert summary["best_trial_id"] == expected["trial_id"]
    assert summary["best_model_size_bytes"] == smallest
    kept = out / "candidates" / f"{expected['trial_id']}.onnx"
    assert (out / "best" / "model.onnx").read_bytes() == kept.read_bytes()

    # candidates/: the front's models beside keep_candidates' one (the best by select). The
    # front's latency is timed again alone after the search (search/_retime.py), among the
    # models the search kept by its own figures: a trial the new figures put on the front
    # whose model the search had dropped (it was off the front then) has none.
    stems = {p.stem for p in (out / "candidates").glob("*.onnx")}
    timed = set(summary["latency_retimed"]["models"]) - {"float"}
    assert stems == (front & timed) | {expected["trial_id"]}
    assert all(r["model_file"] is None for r in rows if r["trial_id"] in front - timed)

    # Resume reads the journal (the trials' own latency): the same records, with the latency
    # timed alone after the search that summary.json holds, give the same front.
    records = Journal(out / "journal.jsonl").load()
    alone = summary["latency_retimed"]["models"]
    records = [
        r.replace(latency_ms=alone[r.trial_id]["median_ms"]) if r.trial_id in alone else r
        for r in records
    ]
    again = pareto_front(records, ["metric", "latency_ms", "model_size_mb"], False)
    assert [r.trial_id for r in again] == summary["pareto_trial_ids"]

    # report.html of the multi-objective search: offline, clean, its front drawn, every trial.
    page = _page(browser, out / "report.html")
    _offline_and_clean(browser)
    charts = {c["key"]: c for c in page["charts"]}
    assert charts["pareto"]["points"] > 0 and charts["pareto"]["drawn"] > 0
    assert len(page["table"]["rows"]) == len(rows)


def test_the_optuna_study_live_and_exported_has_a_direction_per_objective_and_the_front(
    pareto_search, tmp_path
):
    result, storage = pareto_search
    out, summary = result.output_dir, result.summary
    pareto = {r["trial_id"] for r in pq.read_table(out / "pareto.parquet").to_pylist()}
    assert pareto == set(summary["pareto_trial_ids"])
    # Exported: its best trials are pareto.parquet's (latency as timed alone after the search).
    records = Journal(out / "journal.jsonl").load()
    exported = export_study(records, summary, f"sqlite:///{tmp_path / 'e.db'}", "e")
    # Live: each trial as it ended, with the latency it measured in the search.
    live = optuna.load_study(study_name=default_study_name(out, search_id(out)), storage=storage)
    in_search = {r.trial_id for r in pareto_front(records, summary["objectives"], False)}
    for study, front in ((exported, pareto), (live, in_search)):
        assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 3
        assert study.metric_names == ["L2", "latency_ms", "model_size_mb"]
        assert len(study.trials) == len(records)
        assert {t.user_attrs["trial_id"] for t in study.best_trials} == front
