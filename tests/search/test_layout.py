"""One list of the files a search owns (raysearch.layout), and one home for
``stop.iteration_limit`` (the searcher's cap, which the stopper and Tune read)."""

from __future__ import annotations

from pathlib import Path

from raysearch.config import SearchConfig, StopConfig
from raysearch.layout import ATOMIC_FILES, OWNED, RESULT_FILES, USER_OUTPUTS
from raysearch.outputs import write_outputs
from raysearch.outputs._writer import _sweep_leftovers
from raysearch.search.record.journal import Journal
from raysearch.search.runner import _clean_output_dir
from raysearch.search.tune.searchers import SettingSearcher
from raysearch.search.tune.stopper import CandidateStopper, trial_limit
from raysearch.space import SearchSpace
from raysearch.trialrecord import TrialRecord
from tests.models import make_mlp_model


def _records(model_file: str) -> list[TrialRecord]:
    return [
        TrialRecord(
            trial_id=f"t{i}",
            number=i,
            status="ok",
            metric=0.1 * i,
            is_candidate=i == 1,
            duration_s=0.1,
            params={"calibrate_method": ["MinMax", "Percentile"][i % 2]},
            model_file=model_file if i == 1 else None,
        )
        for i in (1, 2, 3)
    ]


def _config(tmp_path: Path) -> SearchConfig:
    raw = {
        "model": "model.onnx",
        "calibration_data": "calib.npz",
        "search_space": {"calibrate_method": ["MinMax", "Percentile"]},
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 0.3,
        "output_dir": str(tmp_path / "out"),
    }
    return SearchConfig.from_dict(raw, check_paths=False)


def test_every_output_written_is_owned_and_removed_by_a_clean(tmp_path: Path):
    out = tmp_path / "out"
    (out / "candidates").mkdir(parents=True)
    make_mlp_model(out / "candidates" / "t1.onnx")
    records = _records("candidates/t1.onnx")
    journal = Journal(out / "journal.jsonl")
    for r in records:
        journal.append(r)
    write_outputs(
        out,
        records,
        config=_config(tmp_path),
        stop_reason="space_exhausted",
        wall_time_s=1.0,
    )
    written = {p.name for p in out.iterdir()}
    assert written <= set(OWNED)
    for name in USER_OUTPUTS.replace("/", "").split(", "):
        assert name in written
    for folder in RESULT_FILES:
        if (out / folder).is_dir():
            assert all(
                any(p.match(pat.format(trial="t1")) for pat in RESULT_FILES[folder])
                for p in (out / folder).iterdir()
            ), folder
    (out / "best" / "notes.txt").write_text("a user's file")
    _clean_output_dir(out, storage_owned=True)
    assert [p.relative_to(out).as_posix() for p in out.rglob("*")] == ["best", "best/notes.txt"]


def test_leftovers_of_a_killed_writer_are_swept(tmp_path: Path):
    left = []
    for sub, stems in ATOMIC_FILES.items():
        folder = tmp_path / sub
        folder.mkdir(exist_ok=True)
        for stem in stems:
            left.append(folder / f".{stem}.123.tmp")
            left[-1].write_text("cut short")
    keep = tmp_path / ".other.123.tmp"
    keep.write_text("not raysearch's")
    _sweep_leftovers(tmp_path)
    assert not any(p.exists() for p in left) and keep.exists()


def test_iteration_limit_has_one_meaning():
    assert trial_limit(StopConfig()) is None
    stop = StopConfig(iteration_limit=2)
    space = SearchSpace.parse({"calibrate_method": ["MinMax", "Percentile", "Entropy"]})
    searcher = SettingSearcher.strategy("Grid", [space], mode="min", max_trials=trial_limit(stop))
    started = [searcher.suggest(f"t{i}") for i in range(4)]
    assert sum(isinstance(s, dict) for s in started) == searcher.max_trials == 2
    assert searcher.finish_reason == "iteration_limit"
    stopper = CandidateStopper(stop, higher_is_better=False)
    for i in range(2):
        searcher.on_trial_complete(f"t{i}", {"metric": 0.1})
        stopper(f"t{i}", {"metric": 0.1, "is_candidate": False})
    assert stopper.stop_all() and stopper.reason == "iteration_limit"
