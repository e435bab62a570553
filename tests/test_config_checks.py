"""The first-day checks of a config: the model file is an ONNX model (``validate`` says so as
``run`` does), a built-in metric's tolerance means something, and names from a fixed
vocabulary are read in any case and kept in their canonical spelling, by one rule."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

from raysearch.cli import main
from raysearch.config import SearchConfig
from raysearch.config.builtin_paths import resolve_builtin
from raysearch.errors import ConfigError, canonical_name
from raysearch.evaluate import Evaluator
from raysearch.modelfile import header_problem
from raysearch.space import SearchSpace
from raysearch.space.points import resolve_point
from raysearch.strategies import canonical_strategy
from tests.external_models import make_external_mlp
from tests.models import make_mlp_model, mlp_data


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A real MLP, its data, and files that are not ONNX models."""
    model = make_mlp_model(tmp_path / "mlp.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, **mlp_data(16))
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "truncated.onnx").write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    (tmp_path / "notes.txt").write_text("model: mlp.onnx\n")
    tensor = onnx.numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    (tmp_path / "tensor.pb").write_bytes(tensor.SerializeToString())
    return {"model": model, "calib": calib, "folder": tmp_path}


def _config(files: dict[str, Path], **extra: Any) -> dict[str, Any]:
    return {
        "model": str(files["model"]),
        "calibration_data": str(files["calib"]),
        "search_space": {"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        "search_algo": "Grid",
        "output_dir": str(files["folder"] / "out"),
        **extra,
    }


# -- 1. the model file -------------------------------------------------------------------------

NOT_A_MODEL = [
    ("calib.npz", r"is not an ONNX model \(cannot parse it: it is a zip archive"),
    ("random.onnx", r"is not an ONNX model \(cannot parse it: no ONNX model field at byte 0"),
    ("truncated.onnx", r"is not an ONNX model \(cannot parse it: the file ends inside its graph"),
    ("notes.txt", r"is not an ONNX model \(cannot parse it"),
    ("tensor.pb", r"is not an ONNX model \(cannot parse it"),
    ("empty.onnx", r"empty\.onnx is empty"),
]


@pytest.mark.parametrize(("name", "message"), NOT_A_MODEL, ids=[n for n, _ in NOT_A_MODEL])
def test_validate_refuses_a_model_that_is_not_an_onnx_model(
    files: dict[str, Path], name: str, message: str, capsys
):
    config = files["folder"] / "config.yaml"
    raw = _config(files, model=name)
    config.write_text(yaml.safe_dump(raw))
    for command in ("validate", "run"):
        assert main([command, str(config)]) == 2
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert len(lines) == 1 and "valid" not in out, (out, err)
        assert re.match(rf"raysearch: error: model: .*{re.escape(name)}", lines[0]), lines[0]
        assert re.search(message, lines[0]), lines[0]
    assert not (files["folder"] / "out").exists()


def test_models_pass_the_header_check_with_their_weights_inline_or_external(tmp_path: Path):
    assert header_problem(make_mlp_model(tmp_path / "inline.onnx")) is None
    external = make_external_mlp(tmp_path / "external.onnx")
    assert header_problem(external) is None
    assert (
        SearchConfig.from_dict(
            {
                "model": str(external),
                "calibration_data": str(external),
                "search_space": "A8W8_SEARCH",
            }
        ).model
        == external
    )


def test_the_header_check_reads_no_weights(tmp_path: Path):
    """A model whose graph bytes are garbage of the right length passes the header check (the
    graph is skipped, not parsed: a 2 GB model costs a few reads); the preflight's parse of
    the graph refuses it before a search starts."""
    from raysearch.search.preflight import check_model

    good = make_mlp_model(tmp_path / "good.onnx")
    proto = onnx.load(str(good))
    graph = proto.graph.SerializeToString()
    proto.graph.Clear()
    proto.graph.name = "g" * (len(graph) - 3)  # the same number of bytes, none of them nodes
    path = tmp_path / "garbage_graph.onnx"
    path.write_bytes(proto.SerializeToString())
    assert header_problem(path) is None
    with pytest.raises(ConfigError, match=r"model: .*not an ONNX model with a graph"):
        check_model(path)


# -- 2. the tolerance of a built-in metric -------------------------------------------------------

REFUSED = [
    ("cos", 1.5, r"tolerance: 1\.5 can never be met: .*cos >= tolerance.*\[-1, 1\]"),
    ("cos", -1, r"tolerance: -1 is met by every trial: .*cos lies in \[-1, 1\]"),
    ("cos", -3, r"tolerance: -3 is met by every trial"),
    ("SSIM", 1.01, r"tolerance: 1\.01 can never be met: .*SSIM lies in \[-1, 1\]"),
    ("PSNR", 120, r"tolerance: 120 can never be met: .*PSNR lies in \(-inf, 100\] dB"),
    ("L2", -0.1, r"tolerance: -0\.1 can never be met: .*L2 <= tolerance.*\[0, inf\)"),
    ("L1", -1e-6, r"tolerance: -1e-06 can never be met: .*L1 lies in \[0, inf\)"),
]


@pytest.mark.parametrize(("metric", "tolerance", "message"), REFUSED)
def test_a_tolerance_nothing_or_everything_meets_is_refused(
    files: dict[str, Path], metric: str, tolerance: float, message: str
):
    with pytest.raises(ConfigError, match=message):
        SearchConfig.from_dict(_config(files, metric=metric, tolerance=tolerance))


WARNED = [
    ("cos", 1.0, "is cos's best value"),
    ("L2", 0, "is L2's best value"),
    ("PSNR", 100, "is PSNR's best value"),
    ("cos", 0.01, "bounds cos itself, not its drop"),
    ("SSIM", -0.5, "bounds SSIM itself, not its drop"),
    ("PSNR", 3, "bounds PSNR itself, not its drop"),
]


@pytest.mark.parametrize(("metric", "tolerance", "words"), WARNED)
def test_an_odd_but_possible_tolerance_is_one_warning_line(
    files: dict[str, Path], metric: str, tolerance: float, words: str, caplog
):
    with caplog.at_level(logging.WARNING, logger="raysearch.config._config"):
        config = SearchConfig.from_dict(_config(files, metric=metric, tolerance=tolerance))
    assert config.tolerance == tolerance
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and words in warnings[0], warnings
    assert warnings[0].startswith(f"tolerance: {tolerance:g} ") and "\n" not in warnings[0]


@pytest.mark.parametrize(
    ("metric", "tolerance"),
    [("cos", 0.999), ("SSIM", 0.98), ("PSNR", 40), ("L2", 0.05), ("L1", 1e-3), ("cos", 0.5)],
)
def test_a_usual_tolerance_is_accepted_in_silence(
    files: dict[str, Path], metric: str, tolerance: float, caplog
):
    with caplog.at_level(logging.WARNING, logger="raysearch.config._config"):
        SearchConfig.from_dict(_config(files, metric=metric, tolerance=tolerance))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_custom_metric_tolerance_bounds_a_drop_and_is_not_range_checked(files):
    config = SearchConfig.from_dict(
        _config(files, metric="tests.evaluators_fixture:mean_output", tolerance=1.5)
    )
    assert config.tolerance == 1.5 and config.is_custom_metric


# -- 3. names from a fixed vocabulary ------------------------------------------------------------


@pytest.mark.parametrize("written", ["cos", "COS", "Cos", "cosine", "COSINE", "cos_sim"])
def test_every_spelling_of_cos_is_the_canonical_metric(files, written: str):
    config = SearchConfig.from_dict(_config(files, metric=written, tolerance=0.99))
    assert config.metric == "cos" and config.raw["metric"] == "cos"
    assert Evaluator(written, tolerance=0.99).name == "cos"


@pytest.mark.parametrize(
    ("written", "canonical"), [("l2", "L2"), ("Psnr", "PSNR"), ("ssim", "SSIM")]
)
def test_other_metrics_in_any_case(files, written: str, canonical: str):
    assert SearchConfig.from_dict(_config(files, metric=written)).metric == canonical


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("metric", "COSS", r"metric: unknown metric 'COSS'.* \(did you mean 'cos'\?\)"),
        (
            "search_algo",
            "tpee",
            r"search_algo: expected one of Auto, Grid, .*got 'tpee' \(did you mean",
        ),
        ("search_space", "a8w8_serach", r"unknown predefined space 'a8w8_serach' \(did you mean"),
        ("tolerance_mode", "relativ", r"tolerance_mode: expected absolute or relative"),
    ],
)
def test_a_wrong_name_still_gets_the_one_line_with_the_closest_name(
    files, key: str, value: str, message: str
):
    extra: dict[str, Any] = {key: value}
    if key == "tolerance_mode":
        extra.update(metric="tests.evaluators_fixture:mean_output", higher_is_better=True)
    with pytest.raises(ConfigError, match=message) as error:
        SearchConfig.from_dict(_config(files, **extra))
    assert "\n" not in str(error.value)


def test_algorithm_space_and_mode_names_in_any_case(files):
    config = SearchConfig.from_dict(
        _config(
            files,
            search_algo="GRID_SEARCH",
            search_space="a8w8_search",
            metric="tests.evaluators_fixture:mean_output",
            tolerance_mode="RELATIVE",
            tolerance=0.01,
        )
    )
    assert config.search_algo == "Grid" and config.raw["search_algo"] == "Grid"
    assert config.tolerance_mode == "relative" and config.raw["tolerance_mode"] == "relative"
    assert canonical_strategy("Tpe") == "TPE" and canonical_strategy("nsga-II") == "NSGAII"
    assert len(config.search_spaces[0].params) > 1  # the predefined A8W8_SEARCH


def test_setting_values_are_read_in_any_case_and_kept_as_the_catalogue_spells_them():
    space = SearchSpace.parse(
        {
            "quantizer": ["ORT"],
            "calibrate_method": ["minmax", "PERCENTILE"],
            "quant_format": ["qdq"],
            "precision": {
                "joint": ["activation_type", "weight_type"],
                "choices": [["quint8", "qint8"], ["QUInt16", "QINT8"]],
            },
            "pct": {
                "only_if": {"calibrate_method": "percentile"},
                "extra_options": {"CalibPercentile": [99.99]},
            },
        }
    )
    settings = [space.to_settings(p) for p in space.expand().points]
    assert {s["calibrate_method"] for s in settings} == {"MinMax", "Percentile"}
    assert {(s["activation_type"], s["weight_type"]) for s in settings} == {
        ("QUInt8", "QInt8"),
        ("QUInt16", "QInt8"),
    }
    assert {s["quantizer"] for s in settings} == {"ort"} and settings[0]["quant_format"] == "QDQ"
    with_pct = [s for s in settings if "extra_options" in s]
    assert with_pct and all(s["calibrate_method"] == "Percentile" for s in with_pct)
    point = resolve_point(space, {"calibrate_method": "MINMAX"})
    assert point["calibrate_method"] == "MinMax"


def test_a_wrong_setting_value_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"calibrate_method: expected one of MinMax, .*'minmaxx'"):
        SearchSpace.parse({"calibrate_method": ["minmaxx"]})
    with pytest.raises(ConfigError, match=r"never takes the value 'entropy'"):
        SearchSpace.parse(
            {
                "calibrate_method": ["MinMax", "Percentile"],
                "g": {"only_if": {"calibrate_method": "entropy"}, "per_channel": [True]},
            }
        )


def test_names_that_differ_only_in_case_are_told_apart_by_their_exact_spelling():
    assert canonical_name("a", ["A", "a"]) == "a" and canonical_name("A", ["A", "a"]) == "A"
    assert canonical_name("á", ["Á"]) == "Á"
    assert canonical_name("x", ["A", "a"]) is None and canonical_name(3, ["3"]) is None


def test_a_builtin_path_name_in_any_case(files):
    config = SearchConfig.from_dict(_config(files, model="builtin:Magika"), check_paths=False)
    assert config.model == resolve_builtin("builtin:magika")
