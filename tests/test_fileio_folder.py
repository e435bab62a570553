"""raysearch.fileio.building_folder: a folder appears whole, the first one built stays."""

from __future__ import annotations

import pytest

from raysearch.fileio import building_folder


def _complete(folder):
    return (folder / "done").is_file()


def test_the_folder_appears_whole_and_the_first_one_stays(tmp_path):
    target = tmp_path / "cache" / "ref"
    with building_folder(target, _complete) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".ref.")
        (tmp / "done").write_text("first")
    with building_folder(target, _complete) as tmp:
        (tmp / "done").write_text("second")
    assert (target / "done").read_text() == "first"
    assert [p.name for p in target.parent.iterdir()] == ["ref"]


def test_an_error_leaves_no_folder_behind(tmp_path):
    target = tmp_path / "ref"
    with pytest.raises(RuntimeError), building_folder(target, _complete) as tmp:
        (tmp / "part").write_text("x")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
