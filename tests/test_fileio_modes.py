"""raysearch.fileio: a file written atomically gets the mode a plain ``open`` gives it (0666
less the umask), as the models written beside it do, not ``mkstemp``'s 0600 (issue 48 item 8:
``best/config.yaml`` and ``plots/*.png`` were 0600 beside 0644 models)."""

from __future__ import annotations

import os
import stat

import pytest

from raysearch.fileio import atomic_write_text, replacing


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_write_has_the_mode_of_a_plain_write(tmp_path, umask):
    atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
    (tmp_path / "plain.txt").write_text("a: 1\n")
    assert _mode(tmp_path / "config.yaml") == 0o666 & ~umask == _mode(tmp_path / "plain.txt")
    with replacing(tmp_path / "plot.png") as tmp:
        tmp.write_bytes(b"png")
    assert _mode(tmp_path / "plot.png") == 0o666 & ~umask
