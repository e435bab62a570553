"""The suite's order under pytest-xdist (``tests/conftest.py``): the files handed out as the
collection orders them, the longest first."""

from __future__ import annotations

import pytest

from tests.conftest import LONGEST_FILES, REPO


def test_xdist_keeps_the_collections_order_of_the_files(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("xdist")
    # pytest-xdist's default (reorder by the number of tests in a file) would hand out the
    # long files of one or two tests last.
    assert request.config.option.loadscopereorder is False


def test_every_longest_file_is_a_test_file_of_the_suite() -> None:
    """A file renamed or removed would silently leave the order it was listed for."""
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    for name in LONGEST_FILES:
        assert (REPO / name).is_file(), name
