"""``raysearch validate`` and ``raysearch spaces`` print the number of settings a Grid search
really runs: the same validity rules and the same backend refusals, checked against real
searches of every preset and of the quickstart's space on a real local Ray."""

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

    if count > FULL_GRID_ON_RAY:
        # Too many trials to run in the suite: Tune's Grid searcher holds exactly ``count``
        # settings (built here without Ray), and a TPE sample of them, every backend of the
        # space among them, runs on Ray without a failure.
        assert _grid_settings(load_config(config)) == count
        data = yaml.safe_load(config.read_text())
        data.update(search_algo="TPE", seed=0, tolerance=0.05, stop={"iteration_limit": 12})
        config.write_text(yaml.safe_dump(data))
        result = AutoSearch(load_config(config)).run()
        assert result.summary["n_trials"] == result.results.num_rows == 12
        (space,) = load_config(config).search_spaces
        backends = [p.domain.choices for p in space.params if p.name == "quantizer"]
        if backends:
            ran = set(result.results.column("params/quantizer").to_pylist())
            assert ran == set(backends[0]), "a backend of the space ran no trial"
    else:
        result = AutoSearch(load_config(config)).run()
        assert result.summary["stop_reason"] == "space_exhausted"
        assert result.summary["n_trials"] == result.results.num_rows == count
    statuses = set(result.results.column("status").to_pylist())
    assert statuses == {"ok"}, "a setting the count included failed to run"


#: Spaces up to this many settings run their whole grid on Ray in the test; a larger one
#: (AUTO_INT8_SEARCH's 108 settings: a minute of trials on a quiet 2-core machine) runs a
#: sample, its count checked on the Grid searcher's phase.
FULL_GRID_ON_RAY = 60


def _grid_settings(config) -> int:
    """How many settings the Grid searcher of ``config`` holds to suggest: its one phase, built
    as a search builds it (the validity rules, the backend's refusals, the repeats dropped).
    Counted on the phase, not by driving Tune's ``suggest`` through every setting
    (A8W8_SEARCH has 26,920): the full grids run on Ray above check that the
    searcher suggests exactly its phase's settings, each of them run."""
    from raysearch.quantize.registry import backend_reject
    from raysearch.search.tune.searchers import SettingSearcher

    searcher = SettingSearcher.strategy(
        "Grid", config.search_spaces, mode="min", reject=backend_reject
    )
    (phase,) = searcher.phases
    return len(phase)
