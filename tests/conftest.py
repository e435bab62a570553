"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray instance (2 CPUs) shared by every end-to-end test of the session; its
    workers can import ``tests`` (custom evaluators named "tests.module:function")."""
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
