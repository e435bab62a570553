"""The score pool: a trial's many settings scored by its process and helper Ray tasks
together (real local Ray, real ONNX Runtime on the planted-outlier model)."""

from __future__ import annotations

import os

import pytest

from tests.models import make_outlier_model
from tests.search.score_pool_fixture import BASE, SETTINGS, Factory


@pytest.fixture
def factory(tmp_path):
    model = make_outlier_model(tmp_path / "outlier.onnx")
    return Factory(os.fspath(model), os.fspath(tmp_path / "cache"))


def _pool(ray, factory, helpers=4):
    from raysearch.search.runtime._score_pool import ScorePool

    return ScorePool(ray.put(factory), threads=1, num_cpus=1.0, helpers=helpers)


@pytest.mark.slow
def test_helpers_score_part_of_the_settings_and_every_score_matches_one_process(
    ray_cluster, factory
):
    runner = factory()
    alone = runner.score_here(runner.model_path, SETTINGS)
    assert all(s is not None for s in alone) and len(set(alone)) > 1

    factory.delay_s = runner.delay_s = 1.5
    pool = _pool(ray_cluster, factory)
    runner.score_pool = pool
    scores = runner.score_settings(runner.model_path, SETTINGS)
    assert scores == pytest.approx(alone, rel=1e-9)
    # The session's CPU free (the caller runs here, holding none): the helpers took part,
    # the caller too.
    assert 1 <= pool.last_helped < len(SETTINGS)
    # A single setting is scored here, without the pool.
    assert runner.score_settings(runner.model_path, SETTINGS[:1]) == pytest.approx(alone[:1])


@pytest.mark.slow
def test_a_helper_that_dies_leaves_its_setting_to_the_caller(ray_cluster, factory):
    factory.only_in = os.getpid()
    runner = factory()
    pool = _pool(ray_cluster, factory)
    runner.score_pool = pool
    scores = runner.score_settings(runner.model_path, SETTINGS)
    assert scores == pytest.approx(runner.score_here(runner.model_path, SETTINGS), rel=1e-9)
    assert pool.last_helped == 0


@pytest.mark.slow
def test_a_failing_setting_is_none_in_its_place(ray_cluster, factory):
    runner = factory()
    runner.score_pool = _pool(ray_cluster, factory)
    broken = {**BASE, "activation_type": "QInt4", "weight_type": "QFLOAT8E4M3FN"}
    scores = runner.score_settings(runner.model_path, [SETTINGS[0], broken, SETTINGS[1]])
    assert scores[1] is None and scores[0] is not None and scores[2] is not None
