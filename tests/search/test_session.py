"""The live session of a search is found by the search's id alone: the id is written with the
folder's marker, survives a move of the folder, and no lookup falls back to another search."""

from __future__ import annotations

import shutil
from pathlib import Path

from raysearch.config import SearchConfig
from raysearch.search.record.journal import Journal
from raysearch.search.record.output_dir import search_id, write_config
from raysearch.search.tune.session import SearchSession, lookup, register, release


def _config(tmp_path: Path) -> SearchConfig:
    return SearchConfig.from_dict(
        {"model": "m.onnx", "calibration_data": "c.npz", "search_space": "A8W8_SEARCH",
         "output_dir": str(tmp_path / "out")},
        check_paths=False,
    )  # fmt: skip


def test_the_id_is_the_markers_and_moves_with_the_folder(tmp_path: Path):
    folder = tmp_path / "out"
    folder.mkdir()
    assert search_id(folder) == str(folder)  # a folder marked before ids were written
    write_config(folder, _config(tmp_path), str(folder / "ray_results"))
    key = search_id(folder)
    assert len(key) == 32 and key != str(folder)
    other = tmp_path / "other"
    other.mkdir()
    write_config(other, _config(tmp_path), str(other / "ray_results"))
    assert search_id(other) != key  # each new search its own
    moved = Path(shutil.move(folder, tmp_path / "moved"))
    assert search_id(moved) == key


def test_a_lookup_finds_its_own_session_or_none(tmp_path: Path):
    journal = Journal(tmp_path / "journal.jsonl")
    session = SearchSession("a" * 32, journal, None, None, None, None)  # type: ignore[arg-type]
    register(session)
    try:
        assert lookup("a" * 32) is session
        # The only session registered is not another search's (a moved folder keeps its id).
        assert lookup(str(tmp_path)) is None
    finally:
        release("a" * 32)
    assert lookup("a" * 32) is None
