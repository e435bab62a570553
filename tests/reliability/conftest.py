"""Fixtures of the reliability tests: one real local Ray (one CPU) for the session, shared with
the other end-to-end tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _root_handlers():
    """``raysearch.cli.main`` configures logging to the stderr of the moment (pytest's capture
    in a test): take its handler away again so that later tests do not log into a closed
    stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
