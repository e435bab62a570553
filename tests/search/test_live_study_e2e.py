"""The live Optuna study (``optuna_storage``) on a real search: real local Ray, ONNX Runtime and
Optuna's SQLite storage, read from a second process while the search runs."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from ray import tune

from raysearch.outputs import default_study_name, export_study
from raysearch.search import AutoSearch
from raysearch.search.record.journal import Journal
from raysearch.search.record.output_dir import search_id

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

FOUR = {"calibrate_method": ["MinMax", "Percentile"], "per_channel": [True, False]}

#: What a second process reads of the storage: each study's trials, by state.
READ = """
import json, sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
url = sys.argv[1]
out = {}
for name in optuna.get_all_study_names(url):
    study = optuna.load_study(study_name=name, storage=url)
    out[name] = sorted(t.user_attrs["trial_id"] for t in study.trials)
print(json.dumps(out))
"""


def read_elsewhere(url: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", READ, url], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


class Probe(tune.Callback):
    """Reads the study from another process each time a trial ends."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ended: list[str] = []
        self.seen: list[tuple[list[str], dict[str, list[str]]]] = []

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended.append(trial.trial_id)
        self.seen.append((list(self.ended), read_elsewhere(self.url)))


def trials_by_id(study) -> dict[str, tuple]:
    return {
        t.user_attrs["trial_id"]: (
            t.state,
            t.value,
            t.params,
            t.user_attrs,
            t.intermediate_values,
        )
        for t in study.trials
    }


def test_a_second_process_sees_each_trial_as_it_ends_and_the_study_is_what_export_writes(
    make_config, tmp_path
):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    probe = Probe(url)
    # One trial actor (a Ray worker's start, several CPU-seconds): each trial's end is seen
    # alike when the trials run one at a time.
    config = make_config(
        search_space=FOUR, optuna_storage=url, resources={"max_concurrent_trials": 1}
    )
    result = AutoSearch(config).run(callbacks=[probe])
    folder = result.output_dir
    name = default_study_name(folder, search_id(folder))
    assert len(probe.seen) == 4
    for ended, studies in probe.seen:
        # While the search ran, the study held exactly the trials that had ended.
        assert studies == {name: sorted(ended)}
    live = optuna.load_study(study_name=name, storage=url)
    records = Journal(folder / "journal.jsonl").load()
    exported = export_study(records, result.summary, f"sqlite:///{tmp_path / 'export.db'}", name)
    assert len(live.trials) == 4
    assert trials_by_id(live) == trials_by_id(exported)
    assert live.user_attrs == exported.user_attrs
    assert live.user_attrs["stop_reason"] == "space_exhausted"
    assert live.direction == exported.direction and live.metric_names == exported.metric_names


def test_a_resumed_search_continues_the_study_without_duplicates(make_config, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    # The first session writes no study; the resumed one adds the two trials journaled
    # before it, then its own.
    # One trial actor per session: trials side by side are not this test's subject.
    config = make_config(
        search_space=FOUR, stop={"iteration_limit": 2}, resources={"max_concurrent_trials": 1}
    )
    first = AutoSearch(config).run()
    resumed = AutoSearch.resume(
        first.output_dir,
        config={**config, "optuna_storage": url, "stop": {"iteration_limit": 3}},
    )
    again = AutoSearch.resume(
        first.output_dir,
        config={**config, "optuna_storage": url, "stop": {"iteration_limit": 4}},
    )
    ids = sorted(r["trial_id"] for r in again.results.to_pylist())
    assert len(ids) == 4 and resumed.summary["n_trials"] == 3
    (studies,) = read_elsewhere(url).values()
    assert studies == ids
