"""The example configs of Quark's AutoSearch and AutoSearchPro documentation and of Neural
Compressor's tuning documentation (``tests/dialects/``, copied as written, only the model and
data paths set) run through ``raysearch validate`` and the Python API: each is accepted, with
its names' mapping logged once, or refused with one line per name that has no raysearch
meaning."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from raysearch.cli import DIALECTS_LOGGER, main
from raysearch.config import SearchConfig, load_config
from raysearch.config._dialects import LOGGER
from raysearch.errors import ConfigError
from tests.models import make_mlp_model, mlp_data

FIXTURES = Path(__file__).parent / "dialects"
#: What the log says of the keys of Quark's configs that raysearch decides by itself.
DECIDED = "decided by raysearch, not by the config: "
_INFER = (
    DECIDED + "fine-tuning infers on each trial's own device (optim_device chooses where it "
    "optimises)"
)

#: fixture -> the refusals (their starts, in order), or None when it is accepted.
REFUSED = {
    "quark_v1_example": [
        "search_space.calibrate_method: PowerOfTwoMethod.MinMSE: power-of-two scales are "
        "extra_options.PowerOfTwoMethod (NonOverflow, MinMSE) in raysearch",
        "search_space.include_auto_mp: not a raysearch setting; raysearch's mixed precision",
    ],
    "quark_yolov3_gpu_space": ["search_space.enable_npu_cnn: Quark's NPU CNN preset"],
    # Refused only on what raysearch cannot do; temp_dir and infer_device are raysearch's own
    # choices (accepted, logged: test_what_raysearch_decides_is_accepted_and_said).
    "quark_pro_example": [
        "search_space.activation_params.calibration_method: LayerwisePercentile: Quark's "
        "percentile per layer",
    ],
    "inc_auto": ["tuning_criterion.timeout: 0 stops at the first setting that meets"],
    "inc_conservative": ["tuning_criterion.timeout: 0 stops at the first setting that meets"],
}
#: fixture -> (search_algo, mappings the log line holds) for those accepted.
ACCEPTED = {
    "quark_v1_advanced_fastft": (
        "FinetuneSearch",
        ["advanced_fastft_search: true -> search_algo: FinetuneSearch", "n_jobs -> resources"],
    ),
    "quark_v1_joint": ("TPE", []),
    "quark_v1_two_stage": (
        "TwoStage",
        ["two_stage_search: true -> search_algo: TwoStage", "CalibrationMethod.MinMax -> MinMax"],
    ),
    "quark_yolov3_space": ("TPE", ["QuantType.QInt16 -> QInt16"]),
    "quark_pro_quickstart": ("Auto", ["model_input -> model", "calib_data_reader -> calib"]),
    "quark_pro_joint": (
        "TwoStage",
        ["search_space.algorithms -> include_fast_ft: [true], extra_options.OptimAlgorithm"],
    ),
    "inc_criteria": (
        "Auto",
        [
            "tuning_criterion.timeout: 0 -> stop.find_n_candidates",
            "accuracy_criterion.criterion -> tolerance_mode",
            "accuracy_criterion.tolerable_loss -> tolerance",
        ],
    ),
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(16))
    (tmp_path / "dialect_eval.py").write_text(
        "def accuracy(model_path, providers):\n    return 1.0\n"
    )
    for path in FIXTURES.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_fixture_is_covered():
    names = {p.stem for p in FIXTURES.glob("*.yaml")} - {"inc_strategies"}
    assert names == set(REFUSED) | set(ACCEPTED)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_documented_config_is_refused_one_line_per_name(folder, name, capsys):
    assert main(["validate", f"{name}.yaml"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(REFUSED[name]), lines
    for line, expected in zip(lines, REFUSED[name], strict=True):
        assert line.startswith(f"raysearch: error: {expected}")
    with pytest.raises(ConfigError) as info:  # the Python API: the same lines
        load_config(folder / f"{name}.yaml")
    errors = getattr(info.value, "errors", (info.value,))
    assert [f"raysearch: error: {e}" for e in errors] == lines


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_documented_config_is_accepted_and_its_mapping_logged_once(folder, name, caplog):
    logging.getLogger(LOGGER).setLevel(logging.NOTSET)
    assert main(["validate", f"{name}.yaml"]) == 0  # sets the logger to INFO, no --debug
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    algo, mappings = ACCEPTED[name]
    assert len(logged) == (1 if mappings else 0), logged
    assert all(m in "".join(logged) for m in mappings), logged
    assert load_config(folder / f"{name}.yaml").search_algo == algo


def _without(folder: Path, name: str, path: tuple[str, ...], value: Any) -> str:
    """The fixture ``name`` with ``value`` taken out of the list or mapping at ``path``,
    written beside it; its file name."""
    data = yaml.safe_load((folder / f"{name}.yaml").read_text())
    holder = data
    for key in path:
        holder = holder[key]
    if isinstance(holder, list):
        holder.remove(value)
    else:
        holder.pop(value)
    (folder / f"{name}_without.yaml").write_text(yaml.safe_dump(data))
    return f"{name}_without.yaml"


def test_what_raysearch_decides_is_accepted_and_said(folder, caplog):
    """AutoSearchPro's example without the one thing raysearch cannot do (Quark's layer-wise
    percentile): its infer_device and temp_dir are accepted, and the log says who decides."""
    logging.getLogger(LOGGER).setLevel(logging.NOTSET)
    path = ("search_space", "activation_params", "calibration_method")
    config = _without(folder, "quark_pro_example", path, "LayerwisePercentile")
    assert main(["validate", config]) == 0
    (logged,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    said = logged.split("; ")
    assert f"search_space.adaquant_params.infer_device: cuda:0: {_INFER}" in said
    assert (
        f"temp_dir: ./temp_dir: {DECIDED}quantization scratch goes to the system's temporary "
        "folder (TMPDIR), caches and outputs under output_dir" in said
    )
    assert load_config(folder / config).search_algo == "TPE"


def test_quark_v1_infer_device_is_accepted_and_said(folder, caplog):
    logging.getLogger(LOGGER).setLevel(logging.NOTSET)
    config = _without(folder, "quark_yolov3_gpu_space", ("search_space",), "enable_npu_cnn")
    assert main(["validate", config]) == 0
    (logged,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f"search_space.extra_options.FastFinetune.InferDevice: cuda:0: {_INFER}" in (
        logged.split("; ")
    )


def test_an_infer_device_that_is_no_device_is_refused(folder, capsys):
    data = yaml.safe_load((folder / "quark_pro_example.yaml").read_text())
    data["search_space"]["activation_params"]["calibration_method"] = ["MinMax"]
    data["search_space"]["adaquant_params"]["infer_device"] = ["gpu0"]
    (folder / "bad.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", "bad.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "raysearch: error: search_space.adaquant_params.infer_device: 'gpu0': not a device "
        "(cpu, cuda or cuda:<index>)"
    ]


def test_cli_shows_the_mapping_without_debug():
    assert DIALECTS_LOGGER == LOGGER


INC_STRATEGIES = yaml.safe_load((FIXTURES / "inc_strategies.yaml").read_text())


@pytest.mark.parametrize("strategy", sorted(INC_STRATEGIES))
def test_neural_compressors_strategies(folder, strategy):
    raw = {
        "model": "mlp.onnx",
        "calibration_data": "calib.npz",
        "search_space": {"per_channel": [True, False]},
        "quant_level": 1,
        "tuning_criterion": {"strategy": strategy},
    }
    expected = INC_STRATEGIES[strategy]
    if ":" in expected:
        with pytest.raises(ConfigError, match=expected):
            SearchConfig.from_dict(raw)
        return
    assert SearchConfig.from_dict(raw).search_algo == expected


def test_neural_compressors_objective_is_select(folder, caplog):
    """performance -> select: latency, modelsize -> select: size, accuracy -> the metric;
    footprint (not measured) refused in one line."""
    raw = {"model": "mlp.onnx", "calibration_data": "calib.npz", "search_space": "A8W8_SEARCH"}
    expected = {"performance": "latency", "modelsize": "size", "accuracy": "metric"}
    for objective, select in expected.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert SearchConfig.from_dict({**raw, "objective": objective}).select == select
        (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert f"objective: {objective} -> select" in line
    nested = {**raw, "tuning_criterion": {"objective": "modelsize"}}
    assert SearchConfig.from_dict(nested).select == "size"
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict({**raw, "objective": "footprint"})
    assert str(info.value) == (
        "objective: expected performance (select: latency), modelsize (select: size) or "
        "accuracy (select: metric); footprint (memory) is not measured, got 'footprint'"
    )
    with pytest.raises(ConfigError, match="objective: modelsize: given together with 'select'"):
        SearchConfig.from_dict({**raw, "objective": "modelsize", "select": "size"})


def test_quark_python_dict_with_onnxruntime_enums(folder, caplog):
    """Quark's examples write ONNX Runtime's enum objects in a Python dict."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    raw = {
        "model_input": "mlp.onnx",
        "calib_data_reader": "calib.npz",
        "search_metric": "cos",
        "search_space": {
            "calibrate_method": [CalibrationMethod.MinMax, CalibrationMethod.Percentile],
            "activation_type": [QuantType.QUInt8],
            "weight_type": [QuantType.QInt8],
        },
        "direction": "maximize",
        "search_algo": "grid_search",
    }
    with caplog.at_level(logging.INFO, logger=LOGGER):
        cfg = SearchConfig.from_dict(raw)
    assert cfg.search_algo == "Grid" and cfg.metric == "cos"
    assert cfg.raw["search_space"]["calibrate_method"] == ["MinMax", "Percentile"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "CalibrationMethod.Percentile -> Percentile" in line
    assert "direction: maximize: what cos is by definition" in line
    with pytest.raises(ConfigError, match="direction: minimize contradicts the metric: cos"):
        SearchConfig.from_dict({**raw, "direction": "minimize"})


def test_power_of_two_methods_alone_are_extra_options(folder):
    cfg = SearchConfig.from_dict(
        {
            "model": "mlp.onnx",
            "calibration_data": "calib.npz",
            "search_space": {"calibrate_method": ["PowerOfTwoMethod.MinMSE", "NonOverflow"]},
        }
    )
    assert cfg.raw["search_space"] == {
        "calibrate_method": ["MinMax"],
        "extra_options": {"PowerOfTwoMethod": ["MinMSE", "NonOverflow"]},
    }


def test_load_study_if_exists_and_plot_results(folder):
    raw = {
        "model_input": "mlp.onnx",
        "calib_data_reader": "calib.npz",
        "search_space": "A8W8_SEARCH",
    }
    cfg = SearchConfig.from_dict({**raw, "load_study_if_exists": True, "plot_results": True})
    assert cfg.resume_if_exists
    with pytest.raises(ConfigError, match="plot_results: raysearch writes plots/ for every"):
        SearchConfig.from_dict({**raw, "plot_results": False})
