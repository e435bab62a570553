"""Locks that cannot be taken: a cache's lock file that cannot be created is warned about
(once per folder) and the block runs unlocked (an entry may be computed twice, never read half
written); an output folder whose lock file cannot be created is refused in one line (a second
search there could not be refused)."""

from __future__ import annotations

import logging

import pytest

from raysearch.errors import InputError
from raysearch.fileio import file_lock
from raysearch.layout import LOCK
from raysearch.search.record.output_dir import hold_output_dir


def test_a_cache_lock_that_cannot_be_created_is_warned_about_once(tmp_path, caplog):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache's folder would be")
    ran = []
    with caplog.at_level(logging.WARNING, logger="raysearch"):
        for key in ("a", "b"):
            with file_lock(blocked / key / ".lock"):
                ran.append(key)
    assert ran == ["a", "b"]
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot lock {blocked / 'a' / '.lock'} (Not a directory): processes sharing"
        f" {blocked / 'a'} may compute the same entry twice",
        f"cannot lock {blocked / 'b' / '.lock'} (Not a directory): processes sharing"
        f" {blocked / 'b'} may compute the same entry twice",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="raysearch"), file_lock(blocked / "a" / ".lock"):
        pass
    assert caplog.records == []  # once per folder


def test_an_output_folder_whose_lock_cannot_be_created_is_refused(tmp_path):
    folder = tmp_path / "out"
    (folder / LOCK).mkdir(parents=True)  # the lock's name taken by a folder
    with pytest.raises(InputError) as refused, hold_output_dir(folder):
        pass
    assert str(refused.value) == (
        f"{folder}: cannot create its lock file {LOCK} (Is a directory); the output folder"
        " must be writable"
    )
