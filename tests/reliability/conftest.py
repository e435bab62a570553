"""Fixtures of the reliability tests: one real local Ray (2 CPUs) for the session, shared with
the other end-to-end tests."""

from __future__ import annotations

import logging
import os

import pytest

from tests.reliability.helpers import REPO


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray instance (started here unless another fixture started it already)."""
    import ray

    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="WARNING",
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    yield ray
    ray.shutdown()


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
