"""``raysearch validate`` and ``raysearch spaces`` print the number of settings a Grid search
really runs: the same validity rules and the same backend refusals, checked for every preset
and the quickstart's space against the suggestions of the Grid searcher a search builds, and
on a real local Ray: the whole grid of the small spaces, a sample of the others' settings."""

from __future__ import annotations

import contextlib
import functools
import io
import re
from pathlib import Path

import pytest
import yaml

from raysearch.cli import main
from raysearch.config import load_config, predefined_spaces
from raysearch.search import AutoSearch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


#: ONNX Runtime refuses QInt8 activations with QUInt8 weights (one of four), and the second
#: space repeats a setting of the first under a group name: 3 + 1 settings run, not 4 + 2.
REFUSED_AND_REPEATED = [
    {"activation_type": ["QInt8", "QUInt8"], "weight_type": ["QInt8", "QUInt8"]},
    {"activation_type": ["QUInt8", "QUInt16"], "weights": {"weight_type": ["QInt8"]}},
]


@functools.cache
def _spaces_rows() -> dict[str, int]:
    """What ``raysearch spaces`` prints: each preset's number of settings. Run once per test
    process: it counts every preset (A8W8_SEARCH's 26,920 settings among them, some 2 CPU-s)
    and prints the same rows each time."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["spaces"]) == 0
    _, *lines = printed.getvalue().splitlines()
    return {name: int(count) for name, count, *_ in (line.split(maxsplit=2) for line in lines)}


@pytest.mark.parametrize("name", [*predefined_spaces(), "quickstart", "refused_and_repeated"])
def test_printed_count_equals_the_trials_a_grid_search_runs(name, mlp_files, tmp_path, capsys):
    if name == "quickstart":
        spaces = {"search_space": yaml.safe_load(QUICKSTART.read_text())["search_space"]}
    elif name == "refused_and_repeated":
        spaces = {"search_spaces": REFUSED_AND_REPEATED}
    else:
        spaces = {"search_space": name}
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(mlp_files["model"]),
                "calibration_data": str(mlp_files["data"]),
                **spaces,
                "search_algo": "Grid",
                "metric": "L2",
                "measure_latency": False,
                # One trial actor per search (an actor's start, and a fine-tuning actor's
                # import of PyTorch, cost more than a trial here); the count is the same.
                "resources": {"max_concurrent_trials": 1},
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    printed = re.search(r"^grid: (\d+) settings", out, re.M)
    assert printed, "validate printed no grid size"
    count = int(printed.group(1))
    # What the backend refuses on this model only (4-bit k-quant on an odd number of blocks
    # a column: the MLP's weights are small), which `spaces`, without a model, counts.
    on_model = re.findall(r"^  dropped by .*k_quant fails where .*: (\d+)$", out, re.M)
    if name in predefined_spaces():
        assert _spaces_rows()[name] == count + sum(map(int, on_model))
    if name == "refused_and_repeated":
        assert count == 4
    # The Grid searcher the search builds (the model's refusals among its rules) suggests
    # exactly ``count`` settings, each once.
    assert _grid_suggestions(load_config(config)) == count

    if name in WHOLE_GRID_ON_RAY:
        result = AutoSearch(load_config(config)).run()
        assert result.summary["stop_reason"] == "space_exhausted"
        assert result.summary["n_trials"] == result.results.num_rows == count
    else:
        # A sample of the settings the count includes runs on Ray, every backend of the space
        # among them, without a failure (a TPE sample: its first trials are spread over the
        # space). That a Grid search runs each of its searcher's suggestions as a trial,
        # exactly once, is the whole grids' above and test_search_e2e.py's
        # test_grid_of_six_runs_exactly_six_trials_and_writes_every_output.
        data = yaml.safe_load(config.read_text())
        sample = SAMPLE_ON_RAY.get(name, SAMPLE_TRIALS)
        data.update(search_algo="TPE", seed=0, tolerance=0.05, stop={"iteration_limit": sample})
        config.write_text(yaml.safe_dump(data))
        result = AutoSearch(load_config(config)).run()
        assert result.summary["n_trials"] == result.results.num_rows == sample
        (space,) = load_config(config).search_spaces
        backends = [p.domain.choices for p in space.params if p.name == "quantizer"]
        if backends:
            ran = set(result.results.column("params/quantizer").to_pylist())
            assert ran == set(backends[0]), "a backend of the space ran no trial"
    statuses = set(result.results.column("status").to_pylist())
    assert statuses == {"ok"}, "a setting the count included failed to run"


#: The spaces whose whole grid runs on Ray in the test, the printed count against the trials
#: run: two spaces with a refused and a repeated setting, a backend's refusals on this model
#: only (WEIGHT_ONLY_INT4_SEARCH's k-quant), and two small presets. The others' counts are
#: checked on the Grid searcher's suggestions, a sample of their settings run.
WHOLE_GRID_ON_RAY = {
    "refused_and_repeated",
    "WEIGHT_ONLY_INT4_SEARCH",
    "WEIGHT_ONLY_INT8_SEARCH",
    "MATMUL_CONV_INT8_SEARCH",
}
#: The trials of a space's sample on Ray: enough to reach each backend of AUTO_INT8_SEARCH's
#: (ONNX Runtime and NNCF), fewer where each trial fine-tunes (FINETUNE_SEARCH: each of its
#: settings fine-tunes the weights for 500 or 1,000 steps).
SAMPLE_TRIALS = 6
SAMPLE_ON_RAY = {"FINETUNE_SEARCH": 3}
#: Above this many settings the count is read from the Grid searcher's phase instead of its
#: suggestions (A8W8_SEARCH's 26,920).
SUGGESTED_UP_TO = 1000


def _grid_suggestions(config) -> int:
    """How many settings the Grid searcher of ``config`` suggests: built as a search builds
    it (the validity rules, the backend's refusals on the config's model, the repeats
    dropped) and driven through Tune's ``suggest`` until it says it is finished, without a
    trial run. Above :data:`SUGGESTED_UP_TO` settings, its phase's length."""
    import functools

    from ray.tune.search import Searcher

    from raysearch.quantize.registry import backend_reject
    from raysearch.search.tune.searchers import SettingSearcher
    from raysearch.strategies import ModelFacts

    reject = functools.partial(backend_reject, weights=ModelFacts.of(config.model).weights)
    searcher = SettingSearcher.strategy("Grid", config.search_spaces, mode="min", reject=reject)
    (phase,) = searcher.phases
    if len(phase) > SUGGESTED_UP_TO:
        return len(phase)
    keys = []
    while (suggestion := searcher.suggest(f"t{len(keys)}")) != Searcher.FINISHED:
        assert suggestion is not None, "the Grid searcher waited for a trial to finish"
        keys.append(suggestion["key"])
    assert len(keys) == len(set(keys)), "the Grid searcher suggested a setting twice"
    assert searcher.finish_reason == "space_exhausted"
    return len(keys)
