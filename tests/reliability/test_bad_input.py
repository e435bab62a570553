"""Bad input is refused before anything runs: exit status 2, one line naming the problem, no
traceback (unless ``--debug``), and nothing written: the output folder is not created, or is
left exactly as it was. Table-driven through the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from raysearch.cli import main
from tests.models import make_mlp_model, mlp_data
from tests.reliability.helpers import run_raysearch, write_config

DELETE = object()


@dataclass
class Case:
    """One bad input: config overrides (``{files}`` in a string is the bad-files folder), the
    text the one-line message must match (a regex), and whether Ray must be running."""

    id: str
    overrides: dict[str, Any]
    message: str
    needs_ray: bool = False
    args: list[str] = field(default_factory=list)


EV = "tests.reliability.evaluators:"
EVR = r"'tests\.reliability\.evaluators:"
NO_GPU = "but the Ray cluster has no GPU"
ONE_OF = "expected one of"
# fmt: off
CASES = [
    # -- the config ---------------------------------------------------------------------------
    Case("unknown key", {"serach_algo": "Grid"},
         r"serach_algo: unknown key \(did you mean 'search_algo'\?\)"),
    Case("unknown nested key", {"stop": {"iteraton_limit": 3}},
         r"stop\.iteraton_limit: unknown key \(did you mean 'iteration_limit'\?\)"),
    Case("unknown resources key", {"resources": {"gpus": 1}}, r"resources\.gpus: unknown key"),
    Case("seed not an integer", {"seed": "abc"}, r"seed: expected an integer, got 'abc'"),
    Case("tolerance not a number", {"tolerance": "tight"},
         r"tolerance: expected a number, got 'tight'"),
    Case("iteration limit not an integer", {"stop": {"iteration_limit": 2.5}},
         r"stop\.iteration_limit: expected an integer, got 2\.5"),
    Case("batch size zero", {"batch_size": 0}, r"batch_size: expected an integer >= 1, got 0"),
    Case("negative timeout", {"trial_timeout_s": -5},
         r"trial_timeout_s: expected a positive number, got -5"),
    Case("negative retries", {"max_failures": -3},
         r"max_failures: expected an integer >= 0, got -3"),
    Case("empty space", {"search_space": {}}, r"search_space: the search space is empty"),
    Case("empty choice list", {"search_space": {"per_channel": []}},
         r"search_space\.per_channel: the list of choices is empty"),
    Case("empty list of spaces", {"search_space": DELETE, "search_spaces": []},
         r"search_spaces: expected a non-empty list of spaces"),
    Case("two space keys", {"search_spaces": [{"per_channel": [True]}]},
         r"search_spaces: give either search_space or search_spaces, not both"),
    Case("unknown setting value", {"search_space": {"activation_type": ["QInt9"]}},
         rf"search_space\.activation_type: {ONE_OF} QInt8, QUInt8, .*got 'QInt9'"),
    Case("unknown setting", {"search_space": {"calibrate_metod": ["MinMax"]}},
         r"search_space\.calibrate_metod: unknown key \(did you mean 'calibrate_method'\?\)"),
    Case("grid over a range",
         {"search_space": {"extra_options": {"CalibPercentile": {"type": "float", "low": 99.0,
                                                                 "high": 99.9}}}},
         r"search_space\.extra_options\.CalibPercentile: Grid search needs a list of choices"),
    Case("unknown algorithm", {"search_algo": "Bayes"},
         rf"search_algo: {ONE_OF} Auto, Grid, Random, TPE, .*got 'Bayes'"),
    Case("unknown metric", {"metric": "L3", "tolerance": DELETE},
         r"metric: unknown metric 'L3'; expected L1, L2, cos, PSNR, SSIM"),
    Case("tolerance mode with a built-in metric", {"tolerance_mode": "relative"},
         r"tolerance_mode: applies to custom metrics only"),
    Case("direction against the metric", {"higher_is_better": True},
         r"higher_is_better: L2 is lower-is-better by definition"),
    Case("candidates without tolerance", {"tolerance": DELETE, "stop": {"find_n_candidates": 2}},
         r"stop\.find_n_candidates: needs a tolerance"),
    Case("unknown predefined space", {"search_space": "INT8_SERACH"},
         r"search_space: unknown predefined space 'INT8_SERACH' \(did you mean 'XINT8_SEARCH'"),
    Case("gpu fraction over one", {"resources": {"gpu_per_trial": 1.5}},
         r"resources\.gpu_per_trial: a fraction must be at most 1"),
    Case("bad override", {}, r"stop\.iteration_limit: an override is written key=value",
         args=["stop.iteration_limit"]),
    Case("override of an unknown key", {},
         r"stop\.iteration_limt: unknown key \(did you mean 'iteration_limit'\?\)",
         args=["stop.iteration_limt=4"]),
    Case("node not in the model", {"search_space": {"nodes_to_exclude": [["fc3"]]}},
         r"nodes_to_exclude: unknown node 'fc3' .*the model has no node of that name"),
    Case("op type not in the model", {"search_space": {"op_types_to_quantize": [["Conv"]]}},
         r"op_types_to_quantize: none of Conv occurs in the model"),
    # -- resources the cluster cannot give --------------------------------------------------
    Case("two GPUs per trial", {"resources": {"gpu_per_trial": 2}},
         rf"resources\.gpu_per_trial is 2 {NO_GPU}", needs_ray=True),
    Case("one GPU per trial", {"resources": {"gpu_per_trial": 1}},
         rf"resources\.gpu_per_trial is 1 {NO_GPU}", needs_ray=True),
    Case("more CPUs than a node has", {"resources": {"cpu_per_trial": 2}},
         r"resources\.cpu_per_trial is 2 but no node of the Ray cluster has more than 1 CPU$",
         needs_ray=True),
    # -- the model ----------------------------------------------------------------------------
    Case("model missing", {"model": "{files}/missing.onnx"},
         r"model: file not found: .*missing\.onnx"),
    Case("model is a folder", {"model": "{files}"},
         r"model: expected an \.onnx file or a model folder .*got a directory with neither"),
    Case("model empty", {"model": "{files}/empty.onnx"}, r"model: .*empty\.onnx is empty"),
    Case("model random bytes", {"model": "{files}/random.onnx"},
         r"model: .*random\.onnx is not an ONNX model \(cannot parse it"),
    Case("model is npz data", {"model": "{files}/calib.npz"},
         r"model: .*calib\.npz is not an ONNX model \(cannot parse it: it is a zip archive"),
    Case("model truncated", {"model": "{files}/truncated.onnx"},
         r"model: .*truncated\.onnx is not an ONNX model \(cannot parse it"),
    Case("model with nothing to quantize",
         {"model": "{files}/exp.onnx", "search_space": {"per_channel": [True]}},
         r"model: exp\.onnx has no op ONNX Runtime can quantize \(its op types: Exp\)"),
    Case("external data missing", {"model": "{files}/external.onnx"},
         r"model: external data file 'external\.onnx\.data' of tensor 'w1' not found"),
    Case("external data truncated", {"model": "{files}/external_short.onnx"},
         r"model: external data file 'external_short\.onnx\.data' is truncated"),
    # -- the data -----------------------------------------------------------------------------
    Case("data missing", {"calibration_data": "{files}/missing.npz"},
         r"calibration_data: file not found: .*missing\.npz"),
    Case("data missing an input", {"calibration_data": "{files}/wrong_name.npz"},
         r"calibration data 'wrong_name\.npz': missing input 'x' \(found 'inp' instead\)"),
    Case("data of the wrong dtype", {"calibration_data": "{files}/float64.npz"},
         r"calibration data 'float64\.npz': input 'x' has dtype float64, model expects float32"),
    Case("data of the wrong shape", {"calibration_data": "{files}/shape.npz"},
         r"calibration data 'shape\.npz': input 'x' has shape \(8, 12\) \(the whole array, its "
         r"first axis the model's batch axis\), model expects \[N, 16\]"),
    Case("data with no samples", {"calibration_data": "{files}/zero.npz"},
         r"calibration data 'zero\.npz': holds 0 samples"),
    Case("data file empty", {"calibration_data": "{files}/empty.npz"},
         r"calibration data 'empty\.npz': file is empty"),
    Case("data not an archive", {"calibration_data": "{files}/random.npz"},
         r"calibration data 'random\.npz': file is not a NumPy \.npz archive"),
    Case("pickled object array", {"calibration_data": "{files}/objects.npy"},
         r"calibration data 'objects\.npy': array 'x' holds Python objects \(pickled\); "
         r"raysearch never loads pickles"),
    Case("pickled object array in an npz", {"calibration_data": "{files}/objects.npz"},
         r"calibration data 'objects\.npz': array 'x' holds Python objects \(pickled\)"),
    Case("unknown data extension", {"calibration_data": "{files}/data.csv"},
         r"calibration data 'data\.csv': unsupported file type '\.csv'"),
    Case("evaluation data of the wrong shape", {"eval_data": "{files}/shape.npz"},
         r"evaluation data 'shape\.npz': input 'x' has shape \(8, 12\) \(the whole array"),
    # -- the evaluator ------------------------------------------------------------------------
    Case("evaluator module missing", {"metric": "tests.reliability.no_such_module:score"},
         r"metric: cannot import module 'tests\.reliability\.no_such_module'"),
    Case("evaluator function missing", {"metric": EV + "prob"},
         r"metric: module 'tests\.reliability\.evaluators' has no function 'prob' "
         r"\(did you mean 'probe'\?\)"),
    Case("evaluator with a wrong signature", {"metric": EV + "one_argument"},
         rf"metric: {EVR}one_argument' must accept \(model_path, providers\)"),
    Case("evaluator not callable", {"metric": EV + "not_callable"},
         rf"metric: {EVR}not_callable' is not callable"),
    Case("evaluator returning a string", {"metric": EV + "returns_text"},
         rf"evaluator {EVR}returns_text' .*returned str 'good', expected a number"),
    Case("evaluator returning NaN", {"metric": EV + "returns_nan"},
         rf"evaluator {EVR}returns_nan' .*returned NaN"),
    Case("evaluator failing on the float model", {"metric": EV + "raises_on_float"},
         rf"evaluator {EVR}raises_on_float' failed on the float model: "
         r"FileNotFoundError: labels\.csv"),
    # -- what the search writes outside its folder, and the libraries' settings (issue 57) ----
    Case("optuna storage in no folder", {"optuna_storage": "sqlite:///{files}/nowhere/study.db"},
         r"optuna_storage: Optuna cannot open sqlite:///.*/nowhere/study\.db \(no folder "
         r".*/nowhere for its database file\)"),
    Case("mlflow database in no folder",
         {"loggers": {"mlflow": {"tracking_uri": "sqlite:///{files}/nowhere/mlflow.db"}}},
         r"loggers\.mlflow\.tracking_uri: MLflow cannot open sqlite:///.*/nowhere/mlflow\.db "
         r"\(no folder .*/nowhere for its database file\)"),
    Case("sampler option of the wrong type",
         {"search_algo": "TPE", "sampler_options": {"n_startup_trials": "five"}},
         r"sampler_options\.n_startup_trials: TPESampler's n_startup_trials takes an integer, "
         r"got 'five'$"),
    Case("logger setting of a value it does not take", {"loggers": {"wandb": {"mode": "offlin"}}},
         r"loggers\.wandb\.mode: wandb's mode takes one of 'online', 'offline', 'disabled', "
         r"'shared' or null, got 'offlin' \(did you mean 'offline'\?\)$"),
]
# fmt: on

CUSTOM = {"tolerance": 0.1, "higher_is_better": True}


def _exp_model(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["y"], name="exp")],
        "exp_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _external_model(folder: Path, name: str, cut: int | None) -> None:
    model = onnx.load(str(make_mlp_model(folder / f"{name}.tmp.onnx")))
    onnx.save_model(
        model,
        str(folder / f"{name}.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{name}.onnx.data",
        size_threshold=0,
    )
    (folder / f"{name}.tmp.onnx").unlink()
    data = folder / f"{name}.onnx.data"
    if cut is None:
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:cut])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A good MLP and its data, and every bad file the cases name."""
    folder = tmp_path_factory.mktemp("inputs")
    good = make_mlp_model(folder / "mlp.onnx")
    np.savez(folder / "calib.npz", **mlp_data(32))
    rng = np.random.default_rng(0)
    (folder / "random.onnx").write_bytes(rng.bytes(4096))
    (folder / "empty.onnx").write_bytes(b"")
    (folder / "truncated.onnx").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    _exp_model(folder / "exp.onnx")
    _external_model(folder, "external", None)
    _external_model(folder, "external_short", 100)
    np.savez(folder / "wrong_name.npz", inp=mlp_data(8)["x"])
    np.savez(folder / "float64.npz", x=mlp_data(8)["x"].astype(np.float64))
    np.savez(folder / "shape.npz", x=np.zeros((8, 12), np.float32))
    np.savez(folder / "zero.npz", x=np.zeros((0, 16), np.float32))
    (folder / "empty.npz").write_bytes(b"")
    (folder / "random.npz").write_bytes(rng.bytes(1024))
    objects = np.empty(4, dtype=object)
    objects[:] = [np.zeros(16, np.float32)] * 4
    np.save(folder / "objects.npy", objects, allow_pickle=True)
    np.savez(folder / "objects.npz", x=objects)
    (folder / "data.csv").write_text("x\n1\n")
    return folder


def _config(files: Path, case_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": str(files / "mlp.onnx"),
        "calibration_data": str(files / "calib.npz"),
        "search_space": {"calibrate_method": ["MinMax"], "per_channel": [True, False]},
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 0.05,
        "output_dir": str(case_dir / "out"),
    }
    if str(overrides.get("metric", "")).startswith("tests."):
        config.update(CUSTOM)
    for key, value in overrides.items():
        if value is DELETE:
            config.pop(key, None)
        else:
            config[key] = _fill(value, files)
    return config


def _fill(value: Any, files: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{files}", str(files))
    if isinstance(value, dict):
        return {k: _fill(v, files) for k, v in value.items()}
    return value


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def test_the_matrix_has_at_least_30_cases():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not c.needs_ray])
def test_bad_input_is_refused_with_one_line_and_nothing_written(
    ray_cluster, case: Case, files: Path, tmp_path: Path, capsys
):
    # On the suite's Ray: a search in a process without Ray starts one beside its preflight
    # (and stops it when the input is refused), seconds per case that check nothing here;
    # that path is the real process's (test_the_real_process_exits_2_without_a_traceback).
    _refused(case, files, tmp_path, capsys)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.needs_ray])
def test_resources_the_cluster_cannot_give_are_refused_before_any_trial(
    ray_cluster, case: Case, files: Path, tmp_path: Path, capsys
):
    _refused(case, files, tmp_path, capsys)


def _refused(case: Case, files: Path, tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path / "config.yaml", _config(files, tmp_path, case.overrides))
    before = _snapshot(tmp_path)
    inputs_before = _snapshot(files)
    status = main(["run", str(config), *case.args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("raysearch: error: "), err
    assert re.search(case.message, lines[0]), lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert _snapshot(tmp_path) == before
    assert _snapshot(files) == inputs_before


def test_a_folder_holding_user_files_is_left_exactly_as_it_was(files: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "mine.txt").write_text("mine")
    (out / "README.md").write_text("my folder")
    before = _snapshot(out)
    for overrides in (
        {"model": "{files}/random.onnx"},
        {"calibration_data": "{files}/objects.npy"},
        {"metric": EV + "returns_nan"},
    ):
        config = write_config(tmp_path / "config.yaml", _config(files, tmp_path, overrides))
        assert main(["run", str(config)]) == 2
        assert _snapshot(out) == before
    assert "raysearch: error" in capsys.readouterr().err


def test_files_of_raysearch_names_not_made_by_raysearch_are_never_overwritten(
    files: Path, tmp_path: Path, capsys
):
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "mine.png").write_bytes(b"my plot")
    (out / "summary.json").write_text("{}")
    before = _snapshot(out)
    config = write_config(tmp_path / "config.yaml", _config(files, tmp_path, {}))
    for extra in ([], ["--overwrite"]):
        assert main(["run", str(config), *extra]) == 2
        err = capsys.readouterr().err
        assert "not created by raysearch" in err and "'plots'" in err and "'summary.json'" in err
        assert _snapshot(out) == before


SUBPROCESS_CASES = [
    "unknown key",
    "model random bytes",
    "pickled object array",
    "evaluator returning NaN",
    "optuna storage in no folder",
]


@pytest.mark.slow
@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_the_real_process_exits_2_without_a_traceback(case_id: str, files: Path, tmp_path: Path):
    (case,) = [c for c in CASES if c.id == case_id]
    config = write_config(tmp_path / "config.yaml", _config(files, tmp_path, case.overrides))
    done = run_raysearch(["run", str(config)], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(case.message, lines[0]), done.stderr
    assert "Traceback" not in done.stderr and not done.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_debug_shows_the_traceback(files: Path, tmp_path: Path):
    config = write_config(
        tmp_path / "config.yaml", _config(files, tmp_path, {"model": "{files}/random.onnx"})
    )
    done = run_raysearch(["--debug", "run", str(config)], tmp_path)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "is not an ONNX model" in done.stderr
    assert not (tmp_path / "out").exists()


def _validate_elsewhere(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``raysearch validate CONFIG`` as a user runs it: the console script, from another
    folder, with no ``PYTHONPATH``."""
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "raysearch"), "validate", str(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_module_beside_the_config_is_found_without_pythonpath(files: Path, tmp_path: Path):
    """A custom evaluator beside the config is found as a script finds the modules beside it
    (README, "Custom evaluators"), from any working directory."""
    (tmp_path / "rs_beside_config.py").write_text(
        "def score(model_path, providers):\n    return 1.0\n"
    )
    config = write_config(
        tmp_path / "config.yaml",
        _config(files, tmp_path, {"metric": "rs_beside_config:score", **CUSTOM}),
    )
    done = _validate_elsewhere(config, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{config}: valid")


def test_an_installed_module_wins_over_a_file_of_its_name_beside_the_config(
    files: Path, tmp_path: Path
):
    """Only a module Python does not find comes from the config's folder: a file there named
    like an installed module (the standard library's ``colorsys``) does not replace it."""
    (tmp_path / "colorsys.py").write_text("def score(model_path, providers):\n    return 1.0\n")
    config = write_config(
        tmp_path / "config.yaml",
        _config(files, tmp_path, {"metric": "colorsys:score", **CUSTOM}),
    )
    done = _validate_elsewhere(config, tmp_path / "elsewhere")
    assert done.returncode == 2
    assert "metric: module 'colorsys' has no function 'score'" in done.stderr
