"""Sensitivity probes kept across searches by content (issue 46, item 3): a second search of
the same float model on the same data reuses the first one's probes instead of running them,
records them as probes (``reused_from``) and ranks the nodes the same; a changed data file
runs them again. The cache's entries are checked by key and by the hash of their bytes."""

from __future__ import annotations

import io
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raysearch.search.record.probe_cache import FOLDER, ProbeCache, content_key, enabled
from raysearch.trialrecord import TrialRecord

PROBE = {"quantizer": "weight_only", "bits": 4, "nodes_4bit": ["a"], "nodes_float": ["b"]}
RECORD = TrialRecord(
    status="ok",
    metric=0.00125,
    extra={"kl": 0.00125, "quantized_share": 0.5},
    model_size_bytes=1234,
    device="cpu",
    duration_s=3.5,
)


def _cache(folder: Path, model: str = "m1", **kwargs: Any) -> ProbeCache:
    return ProbeCache(lambda: {"model": model}, folder, origin="first", **kwargs)


def test_a_kept_probe_is_reused_under_its_key_only(tmp_path):
    assert _cache(tmp_path).store(PROBE, RECORD, "t7")
    found = _cache(tmp_path).lookup(PROBE)
    assert found is not None
    assert found.metric == RECORD.metric and found.model_size_bytes == 1234
    assert found.reused_from == "first trial t7" and found.status == "ok"
    assert found.duration_s == 0.0  # no trial ran for it
    # another model, another probe: nothing
    assert _cache(tmp_path, model="m2").lookup(PROBE) is None
    assert _cache(tmp_path).lookup({**PROBE, "nodes_4bit": ["b"], "nodes_float": ["a"]}) is None
    # the first result kept stays
    assert not _cache(tmp_path).store(PROBE, RECORD.replace(metric=9.0), "t8")
    assert _cache(tmp_path).lookup(PROBE).metric == RECORD.metric


def test_what_is_not_a_complete_probe_on_this_device_is_not_kept(tmp_path):
    cache = _cache(tmp_path)
    assert not cache.store(PROBE, RECORD.replace(stopped_at_rung=0), "t1")
    assert not cache.store(PROBE, RECORD.replace(status="failed", metric=None), "t1")
    assert not cache.store(PROBE, RECORD.replace(device="cuda:0"), "t1")
    assert not cache.store(PROBE, RECORD.replace(reused_from="x trial y"), "t1")
    assert list(tmp_path.iterdir()) == []
    assert _cache(tmp_path, device="cuda").store(PROBE, RECORD.replace(device="cuda:0"), "t1")


def test_a_damaged_or_foreign_entry_is_ignored_and_removed(tmp_path):
    cache = _cache(tmp_path)
    cache.store(PROBE, RECORD, "t1")
    (path,) = tmp_path.iterdir()
    entry = json.loads(path.read_bytes())
    entry["record"]["metric"] = 0.0  # edited: its bytes no longer hash to its name
    path.write_text(json.dumps(entry))
    assert _cache(tmp_path).lookup(PROBE) is None
    assert not path.exists()
    # a file named for this key that holds another key's entry (its name's hash is right)
    cache.store(PROBE, RECORD, "t1")
    (path,) = tmp_path.iterdir()
    other = _cache(tmp_path, model="m2")
    other.store(PROBE, RECORD, "t2")
    (foreign,) = [p for p in tmp_path.iterdir() if p != path]
    digest = path.name.split("-")[0]
    moved = tmp_path / f"{digest}-{foreign.name.split('-', 1)[1]}"
    path.unlink()
    foreign.rename(moved)
    assert _cache(tmp_path).lookup(PROBE) is None
    assert not moved.exists()


def test_candidacy_is_decided_again_by_this_search():
    folder = tempfile.mkdtemp()
    _cache(Path(folder)).store(PROBE, RECORD.replace(is_candidate=True), "t1")

    def strict(metric: float, share: float | None) -> tuple[bool, dict[str, float], float]:
        return metric <= 0.001, {}, metric

    found = _cache(Path(folder), decide=strict).lookup(PROBE)
    assert found is not None and found.is_candidate is False


def test_the_key_names_model_data_metric_device_and_versions(tmp_path):
    from raysearch.data import DataSource
    from tests.lm_models import make_decoder_lm

    model = make_decoder_lm(tmp_path / "lm.onnx", layers=1)
    data = DataSource.load({"input_ids": np.ones((4, 8), np.int64)}, model, batch_size=2)
    other = DataSource.load({"input_ids": np.full((4, 8), 2, np.int64)}, model, batch_size=2)
    common = dict(calibration_data=None, metric="kl", metric_key=None, device="cpu")
    key = content_key(model_hash="h", eval_data=data, measure_latency=True, **common)
    assert key["onnxruntime"] and key["onnx"] and key["raysearch"]
    assert key != content_key(model_hash="h", eval_data=other, measure_latency=True, **common)
    assert key != content_key(model_hash="g", eval_data=data, measure_latency=True, **common)


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv("RAYSEARCH_PROBE_CACHE", "0")
    assert not enabled()
    monkeypatch.delenv("RAYSEARCH_PROBE_CACHE")
    assert enabled()


def _probes(output_dir: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(output_dir / "results.parquet").to_pylist()
    assert {r["status"] for r in rows} == {"ok"}, [r.get("error") for r in rows]
    return sorted(rows, key=lambda r: r["number"])


def _ranking(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    probes = [(r["params/nodes_4bit"][0], r["metric"]) for r in rows
              if r["stage"] == "sensitivity" and r["params/nodes_4bit"]]  # fmt: skip
    return sorted(probes, key=lambda p: -p[1])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_second_search_reuses_the_probes_and_a_changed_data_file_runs_them(tmp_path, monkeypatch):
    from raysearch.search import AutoSearch
    from tests.lm_models import VOCAB, make_decoder_lm

    # This test's own temporary folder: the cache lives in <tmp>/raysearch-<uid>/.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("RAYSEARCH_PROBE_CACHE", raising=False)
    model = make_decoder_lm(tmp_path / "lm.onnx", layers=1)
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "text.npz", input_ids=rng.zipf(1.5, (8, 12)).clip(1, VOCAB - 1))
    config = {
        "model": str(model),
        "calibration_data": str(tmp_path / "text.npz"),
        "batch_size": 4,
        "search_space": {
            "quantizer": ["weight_only"],
            "bits": [4],
            "algorithm": ["rtn"],
            "block_size": [32],
            "symmetric": [True],
        },
        "search_algo": "WeightOnly",
        "metric": "kl",
        "tolerance": 0.02,
        "max_decode_latency": None,  # candidates by KL alone: the tiny decoder's speeds tie
        "select": "size",
        "measure_latency": False,
        "early_stopping": False,
        "seed": 0,
        # One trial actor per search (a Ray worker's start, several CPU-seconds, three times):
        # the probes, their ranking and the promotions do not depend on trials side by side.
        "resources": {"max_concurrent_trials": 1},
    }
    first = AutoSearch({**config, "output_dir": str(tmp_path / "first")}).run()
    rows = _probes(first.output_dir)
    assert [r for r in rows if r["stage"] == "sensitivity" and r["reused_from"]] == []
    assert first.summary["probes_reused"] == 0
    kept = list((tmp_path / "tmp").glob(f"raysearch-*/{FOLDER}/*.json"))
    # q, k, v, o, gate, up, down, lm_head, each at the base's setting and at 8 bits (the menu)
    assert len(kept) == 16

    stream = io.StringIO()
    second = AutoSearch({**config, "output_dir": str(tmp_path / "second")}).run(progress=stream)
    again = _probes(second.output_dir)
    # the progress line counts the reused probes with the trials that ran
    assert f"trials {len(again)} done" in stream.getvalue().strip().splitlines()[-1]
    probes = [r for r in again if r["stage"] == "sensitivity"]
    assert len(probes) == 16 and second.summary["probes_reused"] == 16
    for r in probes:  # journaled as probes, measured by the first search, no trial run
        assert r["reused_from"].startswith(f"{first.output_dir} trial ")
        assert r["trial_id"].startswith("reused_") and r["duration_s"] == 0.0
        assert r["model_file"] is None
    assert _ranking(again) == _ranking(rows)
    promotions = [r["params/nodes_8bit"] for r in rows if r["stage"] == "promotions"]
    assert [r["params/nodes_8bit"] for r in again if r["stage"] == "promotions"] == promotions
    log = (second.output_dir / "auto_search.log").read_text()
    assert len(re.findall(r"reused \(no trial run\)", log)) == 16
    assert "8 of 8 probes reused from an earlier search" in log
    # best/ is a trial that ran (a reused probe has no model)
    assert not second.summary["best_trial_id"].startswith("reused_")
    assert (second.output_dir / "best" / "model.onnx").is_file()

    # a changed data file: another content, so no probe is reused. The search stops at its
    # first probe: a reused probe is journaled in a trial's place and counts towards the
    # iteration limit, so a reuse would be that probe (the later probes run as the first
    # search's did, and the stages after them are checked above)
    np.savez(tmp_path / "text.npz", input_ids=rng.zipf(1.5, (8, 12)).clip(1, VOCAB - 1))
    first_probe = 1 + next(i for i, r in enumerate(rows) if r["stage"] == "sensitivity")
    stop = {"iteration_limit": first_probe}
    third = AutoSearch({**config, "stop": stop, "output_dir": str(tmp_path / "third")}).run()
    probes = [r for r in _probes(third.output_dir) if r["stage"] == "sensitivity"]
    assert len(probes) == 1 and not any(r["reused_from"] for r in probes)
    assert third.summary["probes_reused"] == 0
    assert "reused (no trial run)" not in (third.output_dir / "auto_search.log").read_text()


def _session(folder: Path, key: str, cache: ProbeCache | None) -> Any:
    """A live search session in ``folder`` (journal, recorder, stopper, progress) holding
    ``cache``, registered under ``key``, as a search's Execution builds one."""
    from raysearch.config import StopConfig
    from raysearch.search.record.journal import Journal, SessionClock
    from raysearch.search.record.recorder import TrialRecorder
    from raysearch.search.tune.progress import ProgressCallback
    from raysearch.search.tune.session import SearchSession, register
    from raysearch.search.tune.stopper import CandidateStopper

    folder.mkdir(parents=True)
    journal = Journal(folder / "journal.jsonl")
    stopper = CandidateStopper(StopConfig(), higher_is_better=False)
    recorder = TrialRecorder(folder, journal, higher_is_better=False, on_record=lambda r: None)
    session = SearchSession(key, journal, SessionClock(), stopper, recorder, ProgressCallback())
    session.probe_cache = cache
    register(session)
    return session


def test_a_scripted_search_reuses_every_probe_and_its_resume_runs_none_again(tmp_path):
    """The real searcher over WeightOnly's phases with a scripted language model: a second
    search journals the first one's probes instead of proposing them, promotes the same
    nodes, and a resume of it after its first promotion runs the promotions left only."""
    from raysearch.search.tune.searchers import SettingSearcher
    from raysearch.search.tune.session import release
    from tests.search.test_fallback import _drive
    from tests.search.test_weight_only_strategy import _context, _lm

    def searcher(key: str) -> SettingSearcher:
        made = SettingSearcher.from_strategy("WeightOnly", _context())
        made.session_key = key
        return made

    cache = ProbeCache(lambda: {"model": "scripted"}, tmp_path / "probes", origin="first")
    _session(tmp_path / "first", "first", cache)
    first = _drive(searcher("first"), _lm, slots=2)
    release("first")
    probes = [t for t in first if t.stage == "sensitivity"]
    assert len(probes) == 6 and cache.kept == 6

    session = _session(tmp_path / "second", "second", cache)
    second = _drive(searcher("second"), _lm, slots=2)
    release("second")
    assert not [t for t in second if t.stage == "sensitivity"]  # no probe ran
    journaled = session.recorder.records
    assert len(journaled) == 6 and cache.reused == 6
    assert {r.key for r in journaled} == {t.key for t in probes}
    assert all(r.trial_id.startswith("reused_") and r.reused_from for r in journaled)
    promotions = [t.settings for t in first if t.stage == "promotions"]
    assert [t.settings for t in second if t.stage == "promotions"] == promotions

    # resumed after its first promotion, with the cache off: nothing reruns but what is left
    ran = [t.replace(status="ok") for t in second]
    cut = next(i for i, t in enumerate(ran) if t.stage == "promotions") + 1
    before = sorted([*journaled, *ran[:cut]], key=lambda r: r.number)
    _session(tmp_path / "resumed", "resumed", None)
    resumed = searcher("resumed")
    resumed.add_finished(before)
    rest = _drive(resumed, _lm, slots=1)
    release("resumed")
    assert [t.key for t in rest] == [t.key for t in ran[cut:]]
