"""A search with the user's own Optuna sampler instance, on a real local Ray."""

from __future__ import annotations

import optuna
import pytest

from raysearch.search import AutoSearch
from tests.search.conftest import CONDITIONAL_SPACE

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


def sequence(make_config, tmp_path, name: str, seed: int) -> list[tuple]:
    sampler = optuna.samplers.TPESampler(
        multivariate=True, group=True, seed=seed, n_startup_trials=2
    )
    config = make_config(
        search_space=CONDITIONAL_SPACE,
        search_algo=sampler,
        stop={"iteration_limit": 7},
        # One trial at a time: the sampler learns each result before its next proposal.
        resources={"max_concurrent_trials": 1},
        output_dir=str(tmp_path / name),
    )
    result = AutoSearch(config).run()
    rows = sorted(result.records, key=lambda r: r.number)
    assert len(rows) == 7 and all(r.status == "ok" for r in rows)
    return [tuple(sorted((k, repr(v)) for k, v in r.params.items())) for r in rows]


def test_a_configured_tpe_sampler_runs_twice_with_identical_trial_sequences(make_config, tmp_path):
    first = sequence(make_config, tmp_path, "a", seed=3)
    assert sequence(make_config, tmp_path, "b", seed=3) == first
    # The instance's own seed decides the sequence (it is used as given, not rebuilt).
    assert sequence(make_config, tmp_path, "c", seed=4) != first
