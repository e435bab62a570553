"""LiveStudy: a search's records written one by one into an Optuna study in a real SQLite
storage, as a resumed search reopens it."""

from __future__ import annotations

import optuna

from raysearch.outputs import LiveStudy
from raysearch.space import SearchSpace
from raysearch.trialrecord import TrialRecord


def record(trial_id: str, number: int, **params) -> TrialRecord:
    return TrialRecord(
        trial_id=trial_id,
        number=number,
        status="ok",
        metric=0.1 * number,
        is_candidate=number % 2 == 0,
        params=params,
    )


def test_a_parameter_outside_the_declared_distribution_is_kept_as_a_user_attribute(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = SearchSpace.parse({"calibrate_method": ["MinMax", "Percentile"]})
    live = LiveStudy(url, "s", {"metric": "L2", "higher_is_better": False}, spaces=[space])
    live.open()
    live.add(record("t1", 1, calibrate_method="MinMax", nodes=["a"], alpha=0.5))
    # A node list no space declares: its first value fixed the study's choices.
    live.add(record("t2", 2, calibrate_method="Percentile", nodes=["b"], alpha=0.9))
    live.add(record("t2", 2, calibrate_method="Percentile", nodes=["b"], alpha=0.9))  # again
    study = optuna.load_study(study_name="s", storage=url)
    first, second = study.trials
    assert first.params == {"calibrate_method": "MinMax", "nodes": '["a"]', "alpha": 0.5}
    assert second.params == {"calibrate_method": "Percentile", "alpha": 0.9}
    assert second.user_attrs["params/nodes"] == '["b"]'
    # The declared choices, not those seen so far.
    assert first.distributions["calibrate_method"].choices == ("MinMax", "Percentile")

    # A resumed search reopens the study and adds only what it lacks.
    again = LiveStudy(url, "s", {"metric": "L2", "higher_is_better": False}, spaces=[space])
    again.open([record("t1", 1, calibrate_method="MinMax"), record("t3", 3, alpha=2.0)])
    ids = [t.user_attrs["trial_id"] for t in optuna.load_study(study_name="s", storage=url).trials]
    assert ids == ["t1", "t2", "t3"]
