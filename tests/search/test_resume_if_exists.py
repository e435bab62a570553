"""``resume_if_exists`` (Quark's ``load_study_if_exists``) end to end: ``run`` continues an
earlier run of the same search in its output folder, from Python and from the command line,
keeping every trial of the earlier runs and running none again, with the stop conditions of
the config given (a raised ``n_trials`` makes a finished search go on); a folder that holds
another search is one line, exit status 2."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from raysearch.errors import ConfigError
from raysearch.search import AutoSearch
from tests.models import make_mlp_model, mlp_data

#: Quark's names: a grid of four settings.
SPACE = {
    "per_channel": [True, False],
    "activation_type": ["QuantType.QUInt8", "QuantType.QInt8"],
}


def _quark_config(tmp_path, n_trials: int) -> dict:
    model = tmp_path / "mlp.onnx"
    if not model.is_file():
        make_mlp_model(model)
        np.savez(tmp_path / "calib.npz", **mlp_data(16))
    return {
        "model_input": str(model),
        "calib_data_reader": str(tmp_path / "calib.npz"),
        "search_space": SPACE,
        "search_algo": "grid_search",
        "search_metric": "cos",
        "n_trials": n_trials,
        "load_study_if_exists": True,
        "measure_latency": False,
        "output_dir": str(tmp_path / "out"),
    }


def _trials(records) -> dict[str, tuple]:
    """Each trial by its id: its setting and when it ended (a trial run again would differ)."""
    return {r.trial_id: (r.key, r.elapsed_s, r.metric) for r in records}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_second_run_continues_the_first_from_python_and_the_command_line(tmp_path, capsys):
    first = AutoSearch(_quark_config(tmp_path, 1)).run()
    assert first.stop_reason == "iteration_limit" and len(first.records) == 1
    before = _trials(first.records)

    # The same config again: the search had finished, nothing runs.
    again = AutoSearch(_quark_config(tmp_path, 1)).run()
    assert _trials(again.records) == before

    # n_trials raised: the finished search goes on, its trial kept and not run again.
    second = AutoSearch(_quark_config(tmp_path, 2)).run()
    after = _trials(second.records)
    assert len(after) == 2 and {k: after[k] for k in before} == before
    assert len({key for key, _, _ in after.values()}) == 2  # a new setting, none repeated
    assert second.summary["n_trials"] == 2

    # The command line: the same, from a YAML file of Quark's names.
    path = tmp_path / "quark.yaml"
    path.write_text(yaml.safe_dump(_quark_config(tmp_path, 3)))
    assert main(["run", str(path)]) == 0
    assert "continuing the search in" in capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "out" / "raysearch_config.yaml").read_text())
    assert saved["stop"] == {"iteration_limit": 3}  # what a later `raysearch resume` runs
    third = AutoSearch.resume(tmp_path / "out")
    final = _trials(third.records)
    assert len(final) == 3 and {k: final[k] for k in after} == after
    assert len({key for key, _, _ in final.values()}) == 3
    assert third.stop_reason == "iteration_limit" and third.summary["n_trials"] == 3

    # Another search in that folder: one line naming the key, exit status 2.
    other = {**_quark_config(tmp_path, 3), "search_metric": "L2"}
    with pytest.raises(ConfigError, match=r"^resume_if_exists: .*\(its metric differ"):
        AutoSearch(other).run()
    path.write_text(yaml.safe_dump(other))
    assert main(["run", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("raysearch: error: resume_if_exists: ")
    assert "its metric differ" in errors[0]


def _config(tmp_path, **changes):
    from raysearch.config import SearchConfig

    raw = {**_quark_config(tmp_path, 2), **changes}
    return SearchConfig.from_dict(raw)


def test_the_folder_of_the_same_search_is_continued_another_refused(tmp_path):
    import json

    from raysearch.search.record.output_dir import (
        continued_folder,
        rewrite_config,
        stop_changed,
        write_config,
    )

    config = _config(tmp_path)
    folder = config.output_dir.resolve()
    assert continued_folder(config) is None  # nothing there yet: a new search
    folder.mkdir()
    write_config(folder, config, str(folder / "ray_results"))
    assert continued_folder(config) == folder
    assert continued_folder(_config(tmp_path, load_study_if_exists=False)) is None
    raised = _config(tmp_path, n_trials=5)
    assert continued_folder(raised) == folder  # the stop conditions may change
    assert not stop_changed(folder, config) and stop_changed(folder, raised)
    other = _config(tmp_path, search_metric="L2", search_space={"per_channel": [True]})
    with pytest.raises(ConfigError, match=r"^resume_if_exists: .*\(its search_space, metric"):
        continued_folder(other)
    marker = json.loads((folder / ".raysearch.json").read_text())
    rewrite_config(folder, raised)
    rewritten = json.loads((folder / ".raysearch.json").read_text())
    assert rewritten["search_id"] == marker["search_id"]
    assert not stop_changed(folder, raised)
