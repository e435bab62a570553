"""Config loading: the contract keys, Quark names, defaults, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from raysearch.cli import main
from raysearch.config import SearchConfig, apply_overrides, load_config
from raysearch.errors import ConfigError
from raysearch.space import SearchSpace
from tests.models import make_mlp_model, mlp_data


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    model = make_mlp_model(tmp_path / "model.onnx")
    calib = tmp_path / "calib.npz"  # `validate` loads it against the model, as `run` does
    np.savez(calib, **mlp_data(16))
    return {"model": str(model), "calibration_data": str(calib)}


def _base(files: dict[str, str], **extra) -> dict:
    return {**files, "search_space": {"per_channel": [True, False]}, **extra}


def test_defaults_and_eval_data_falls_back_to_calibration(files):
    cfg = SearchConfig.from_dict(_base(files))
    assert cfg.search_algo == "TPE"
    assert cfg.metric == "L2" and not cfg.metric_higher_is_better
    assert cfg.eval_data == cfg.calibration_data
    assert cfg.stop.iteration_limit == -1 and cfg.stop.find_best_candidate is None
    assert cfg.resources.cpu_per_trial == 1 and cfg.resources.max_concurrent_trials is None


def test_quark_names_map_to_ours(files, caplog):
    raw = {
        **files,
        "search_space": "XINT8_SEARCH",
        "search_metric": "cosine",
        "search_metric_tolerance": 0.99,
        "search_stop_condition": {"find_n_candidates": 2},
        "n_trials": 10,
        "n_jobs": 2,
        "search_algo": "grid_search",
    }
    with caplog.at_level("INFO", logger="raysearch.config.dialects"):
        cfg = SearchConfig.from_dict(raw)
    assert cfg.metric == "cos" and cfg.metric_higher_is_better
    assert cfg.tolerance == 0.99
    assert cfg.stop.find_n_candidates == 2 and cfg.stop.iteration_limit == 10
    assert cfg.resources.max_concurrent_trials == 2
    assert cfg.search_algo == "Grid"
    # Every mapping in one line, logged once.
    (line,) = [r.getMessage() for r in caplog.records if r.name == "raysearch.config.dialects"]
    assert "n_jobs -> resources.max_concurrent_trials" in line
    assert "search_metric -> metric" in line and "n_trials -> stop.iteration_limit" in line


def test_predefined_space_by_name_and_several_spaces_in_order(files):
    cfg = SearchConfig.from_dict(
        {**files, "search_spaces": ["A8W8_SEARCH", {"per_channel": [True]}]}
    )
    assert [s.name for s in cfg.search_spaces] == ["search_spaces[0]", "search_spaces[1]"]


def test_relative_paths_resolve_against_the_config_file(tmp_path, files):
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "model": "../model.onnx",
                "calibration_data": "../calib.npz",
                "search_space": {"per_channel": [True]},
            }
        )
    )
    cfg = load_config(sub / "config.yaml")
    assert cfg.model == (sub / "../model.onnx")


def test_overrides_set_nested_keys_parsed_as_yaml():
    data = apply_overrides({"stop": {"time_limit": 5}}, ["stop.iteration_limit=20", "seed=3"])
    assert data == {"stop": {"time_limit": 5, "iteration_limit": 20}, "seed": 3}


def test_builtin_demo_model_resolves_to_the_packaged_file():
    cfg = SearchConfig.from_dict(
        {
            "model": "builtin:magika",
            "calibration_data": str(Path(__file__)),
            "search_space": {"per_channel": [True]},
        }
    )
    assert cfg.model.name == "model.onnx" and cfg.model.exists()


# (description, config changes, expected message)
BAD_CONFIGS = [
    (
        "typo in a top-level key",
        {"serch_algo": "TPE"},
        "serch_algo: unknown key (did you mean 'search_algo'?)",
    ),
    (
        "typo in a space key",
        {"search_space": {"calibrate_metod": ["MinMax"]}},
        "search_space.calibrate_metod: unknown key (did you mean 'calibrate_method'?)",
    ),
    (
        "typo in extra_options",
        {"search_space": {"extra_options": {"ActivationSymetric": [True]}}},
        "search_space.extra_options.ActivationSymetric: unknown key (did you mean "
        "'ActivationSymmetric'?)",
    ),
    (
        "extra option at the top level",
        {"search_space": {"WeightSymmetric": [True]}},
        "'WeightSymmetric' is an extra_options key: put it under extra_options",
    ),
    (
        "empty list of choices",
        {"search_space": {"per_channel": []}},
        "search_space.per_channel: the list of choices is empty",
    ),
    ("empty space", {"search_space": {}}, "search_space: the search space is empty"),
    (
        "wrong value type",
        {"search_space": {"per_channel": ["yes"]}},
        "search_space.per_channel: expected true or false, got 'yes'",
    ),
    (
        "unknown enum value",
        {"search_space": {"activation_type": ["QInt8", "INT8"]}},
        "search_space.activation_type[1]: expected one of QInt8, QUInt8",
    ),
    (
        "op types as a flat list",
        {"search_space": {"op_types_to_quantize": ["MatMul", "Conv"]}},
        "each choice of op_types_to_quantize is a list of names or null, got 'MatMul'",
    ),
    (
        "range under Grid",
        {
            "search_algo": "Grid",
            "search_space": {
                "extra_options": {"CalibPercentile": {"type": "float", "low": 99.0, "high": 99.99}}
            },
        },
        "Grid search needs a list of choices; this is a range",
    ),
    (
        "only_if on an unknown key",
        {
            "search_space": {
                "calibrate_method": ["MinMax"],
                "g": {"only_if": {"calibrate_methd": "MinMax"}, "per_channel": [True]},
            }
        },
        "search_space.g.only_if: refers to unknown key 'calibrate_methd' "
        "(did you mean 'calibrate_method'?)",
    ),
    (
        "only_if on a value never taken",
        {
            "search_space": {
                "calibrate_method": ["MinMax"],
                "g": {"only_if": {"calibrate_method": "Entropi"}, "per_channel": [True]},
            }
        },
        "'calibrate_method' never takes the value 'Entropi'",
    ),
    (
        "range with low > high",
        {
            "search_algo": "TPE",
            "search_space": {
                "extra_options": {"CalibPercentile": {"type": "float", "low": 99.9, "high": 99.0}}
            },
        },
        "low (99.9) is greater than high (99.0)",
    ),
    (
        "range of an unknown type",
        {"search_space": {"extra_options": {"num_bins": {"type": "integer", "low": 1, "high": 3}}}},
        "search_space.extra_options.num_bins.type: expected int, float or categorical",
    ),
    (
        "float range for an integer setting",
        {"search_space": {"extra_options": {"num_bins": {"type": "float", "low": 1, "high": 3}}}},
        "'num_bins' is an integer setting: use type: int",
    ),
    (
        "percentile out of bounds",
        {"search_space": {"extra_options": {"CalibPercentile": [101]}}},
        "expected a value <= 100.0, got 101",
    ),
    (
        "unknown search algorithm",
        {"search_algo": "Bayes"},
        "search_algo: expected one of Auto, Grid, Random, TPE, CmaEs, GPS, NSGAII, QMC, "
        "Fallback, Conservative, TwoStage, FinetuneSearch, WeightOnly, got 'Bayes' (did you "
        "mean 'bayesian'?)",
    ),
    ("unknown metric", {"metric": "L3"}, "metric: unknown metric 'L3'"),
    (
        "evaluator module missing",
        {"metric": "no_such_pkg.mod:fn"},
        "metric: cannot import module 'no_such_pkg.mod'",
    ),
    (
        "evaluator function missing",
        {"metric": "raysearch.demo.evaluators:top1_agreemnt"},
        "module 'raysearch.demo.evaluators' has no function 'top1_agreemnt' (did you mean "
        "'top1_agreement'?)",
    ),
    (
        "evaluator with a wrong signature",
        {"metric": "os.path:exists"},
        "must accept (model_path, providers)",
    ),
    (
        "tolerance_mode with a built-in metric",
        {"metric": "cos", "tolerance_mode": "relative"},
        "tolerance_mode: applies to custom metrics only",
    ),
    (
        "higher_is_better against the metric",
        {"metric": "L2", "higher_is_better": True},
        "higher_is_better: L2 is lower-is-better by definition",
    ),
    (
        "find_n_candidates without tolerance",
        {"stop": {"find_n_candidates": 2}},
        "stop.find_n_candidates: needs a tolerance",
    ),
    (
        "typo in stop",
        {"stop": {"iteration_limt": 3}},
        "stop.iteration_limt: unknown key (did you mean 'iteration_limit'?)",
    ),
    (
        "negative time limit",
        {"stop": {"time_limit": -5}},
        "stop.time_limit: expected seconds > 0 or -1, got -5",
    ),
    (
        "zero CPUs per trial",
        {"resources": {"cpu_per_trial": 0}},
        "resources.cpu_per_trial: expected a number > 0, got 0",
    ),
    (
        "GPU fraction above one",
        {"resources": {"gpu_per_trial": 1.5}},
        "resources.gpu_per_trial: a fraction must be at most 1",
    ),
    (
        "string where a number belongs",
        {"tolerance": "small"},
        "tolerance: expected a number, got 'small'",
    ),
    (
        "both search_space and search_spaces",
        {"search_spaces": [{"per_channel": [True]}]},
        "search_spaces: give either search_space or search_spaces, not both",
    ),
    (
        "unknown predefined space",
        {"search_space": "A8W8"},
        "search_space: unknown predefined space 'A8W8' (did you mean 'A8W8_SEARCH'?)",
    ),
    (
        "Quark and raysearch name together",
        {"n_jobs": 2, "resources": {"max_concurrent_trials": 2}},
        "n_jobs: given together with 'resources.max_concurrent_trials'",
    ),
    ("seed not an integer", {"seed": 1.5}, "seed: expected an integer, got 1.5"),
    (
        "cyclic conditions",
        {
            "search_space": {
                "a": {"only_if": {"reduce_range": True}, "per_channel": [True, False]},
                "b": {"only_if": {"per_channel": True}, "reduce_range": [True, False]},
            }
        },
        "only_if conditions form a cycle",
    ),
    # Other tools' spellings of techniques are refused with what to write instead, never
    # accepted and dropped.
    (
        "joint fine-tuning parameter outside extra_options",
        {"search_space": {"adaround_params": {"NumIterLR": [[1000, 0.1], [500, 0.01]]}}},
        "search_space.adaround_params.NumIterLR: unknown key ('NumIterLR' is an extra_options "
        "key: put it under extra_options)",
    ),
    (
        "fine-tuning algorithm switch in another tool's spelling",
        {
            "search_space": {
                "algorithm": ["none", "adaquant"],
                "p": {"only_if": {"algorithm": "adaquant"}, "learning_rate": [1e-5]},
            }
        },
        "search_space.algorithm: not a raysearch setting; fine-tuning is include_fast_ft: true",
    ),
    (
        "SmoothQuant through ONNX Runtime's extra_options",
        {"search_space": {"extra_options": {"SmoothQuant": [True], "SmoothQuantAlpha": [0.5]}}},
        "search_space.extra_options.SmoothQuant: ONNX Runtime's SmoothQuant needs "
        "neural-compressor 2.x, which raysearch does not install; raysearch's own is include_sq",
    ),
    (
        "Quark's auto mixed precision switch",
        {"search_space": {"include_auto_mp": [True]}},
        "search_space.include_auto_mp: not a raysearch setting; raysearch's mixed precision",
    ),
    (
        "joint parameter over an unknown setting",
        {
            "search_space": {
                "pair": {"joint": ["activation_type", "weigth_type"], "choices": [["QInt8", 1]]}
            }
        },
        "search_space.pair.joint.weigth_type: unknown key (did you mean 'weight_type'?)",
    ),
    (
        "joint parameter with a value its setting does not take",
        {
            "search_space": {
                "pair": {
                    "joint": ["activation_type", "weight_type"],
                    "choices": [["QUInt8", "QInt8"], ["QUInt16", "Int8"]],
                }
            }
        },
        "search_space.pair.choices[1]: weight_type: expected one of",
    ),
]


@pytest.mark.parametrize(
    "changes, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_names_the_key_path(files, changes, message):
    raw = _base(files)
    raw.update(changes)
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(raw)
    # The mistake is the first one reported; a config with several reports each, one line each.
    errors = getattr(info.value, "errors", (info.value,))
    assert message in str(errors[0])
    assert all("\n" not in str(e) for e in errors)


def test_missing_model_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model: file not found: .*nope\.onnx"):
        SearchConfig.from_dict(
            {
                "model": str(tmp_path / "nope.onnx"),
                "calibration_data": "x",
                "search_space": {"per_channel": [True]},
            }
        )


def test_cli_exits_2_with_one_line_and_suggestion(tmp_path, files, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**files, "search_space": {"calibrate_metod": ["MinMax"]}}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "raysearch: error: search_space.calibrate_metod: unknown key "
        "(did you mean 'calibrate_method'?)"
    )
    assert not (tmp_path / "raysearch_output").exists()


def test_cli_bad_yaml_and_missing_file_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    assert main(["validate", str(broken)]) == 2
    assert "not valid YAML at line" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_cli_spaces_lists_the_presets_with_sizes(capsys):
    import importlib.util

    from raysearch.config import predefined_spaces
    from raysearch.config._spaces import parse_spaces
    from raysearch.quantize.registry import backend_reject

    assert main(["spaces"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "settings", "description"]
    # One row per preset: its name, then its number of settings as a whole column.
    sizes = {}
    for line in lines:
        name, count = line.split(maxsplit=2)[:2]
        sizes[name] = int(count)
    presets = predefined_spaces()
    assert set(sizes) == set(presets) and len(lines) == len(presets)
    for name in presets:
        (space,) = parse_spaces({"search_space": name})
        # The settings a Grid search runs: the backends' refusals are not among them.
        assert sizes[name] == len(space.expand(backend_reject)), name
    # A8W8: 672 static settings x CLE x SmoothQuant (off, 4 alphas) x bias correction x
    # AdaQuant (off without PyTorch), and dynamic: 4 (per_channel x op types) x CLE x SmoothQuant.
    fine_tuning = 2 if importlib.util.find_spec("torch") else 1
    assert sizes["A8W8_SEARCH"] == 672 * 2 * 5 * 2 * fine_tuning + 4 * 2 * 5
    assert sizes["A16W8_SEARCH"] == 48
    # XINT8: 8 calibration settings x output quantization x top_k x power-of-two x CLE x
    # AdaRound (off without PyTorch).
    assert sizes["XINT8_SEARCH"] == 192 * fine_tuning
    # FINETUNE: 4 calibration settings x 2 algorithms x 2 (iterations, learning rate) each.
    assert sizes["FINETUNE_SEARCH"] == 16
    # AUTO_INT8: ONNX Runtime 2 activation types x 3 calibrations x 2 op types x 2 symmetries x
    # 2 output choices; NNCF (without NNCF installed: none of it) transformer: 2 presets x 3
    # estimators x 2 overflow fixes x 3 alphas (fast_bias_correction: false refused), none:
    # 2 presets x 2 bias corrections x 3 estimators x 2 overflow fixes.
    nncf = 36 + 24 if importlib.util.find_spec("nncf") else 0
    assert sizes["AUTO_INT8_SEARCH"] == 48 + nncf


def test_cli_validate_prints_grid_size_and_rule_drops(tmp_path, files, capsys):
    path = tmp_path / "ok.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **files,
                "search_algo": "Grid",
                "search_space": {
                    "calibrate_method": ["MinMax", "Percentile"],
                    "extra_options": {"CalibPercentile": [99.9, 99.99]},
                },
            }
        )
    )
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "grid: 3 settings (4 combinations)" in out
    assert "dropped by percentile_without_percentile_method: 1" in out


def test_quickstart_config_validates():
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "quickstart.yaml", check_paths=False)
    assert cfg.search_algo == "Grid" and cfg.is_custom_metric


def test_cli_refuses_fine_tuning_keys_before_anything_runs(tmp_path, files, capsys, monkeypatch):
    """The issue's own example: a joint fine-tuning parameter outside ``extra_options`` used to
    validate as 1 setting and reach no quantizer; it exits 2 with one line saying where it
    belongs."""
    monkeypatch.chdir(tmp_path)  # where run's default output_dir would be created
    path = tmp_path / "ft.yaml"
    space = {"adaround_params": {"NumIterLR": [[1000, 0.1], [500, 0.01]]}}
    path.write_text(yaml.safe_dump({**files, "search_space": space}))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith(
            "raysearch: error: search_space.adaround_params.NumIterLR: unknown key "
            "('NumIterLR' is an extra_options key"
        )
    assert not (tmp_path / "raysearch_output").exists()


def test_quark_technique_spaces_parse_into_technique_settings():
    """Quark's AutoSearch spellings of CLE, SmoothQuant and fine-tuning (its nested
    ``FastFinetune`` group and joint ``NumIterLR``) are raysearch settings."""
    space = SearchSpace.parse(
        {
            "include_cle": [True, False],
            "include_sq": [True],
            "include_fast_ft": [True],
            "extra_options": {
                "SmoothAlpha": [0.5],
                "FastFinetune": {
                    "OptimAlgorithm": ["adaround", "adaquant"],
                    "NumIterLR": [[100, 1e-4], [200, 1e-5]],
                },
            },
        }
    )
    settings = [space.to_settings(p) for p in space.expand().points]
    assert len(settings) == 8
    assert settings[0] == {
        "include_cle": True,
        "include_sq": True,
        "include_fast_ft": True,
        "extra_options": {
            "SmoothAlpha": 0.5,
            "OptimAlgorithm": "adaround",
            "NumIterLR": [100, 1e-4],
        },
    }


def test_cli_output_piped_into_a_reader_that_stops_early_is_no_error():
    """``raysearch spaces | head -1``: the reader has closed the pipe by the time raysearch
    writes; raysearch exits 0 and says nothing (it used to report an internal error)."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "read, write = os.pipe()\n"
        "os.close(read)\n"  # the reader is gone before anything is written
        "os.dup2(write, 1)\n"
        "sys.stdout.reconfigure(line_buffering=True)\n"  # each line written at once
        "from raysearch.cli import main\n"
        "sys.exit(main(['spaces']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


# -- early_stopping: on by default, false turns it off, a mapping sets the rungs -------------
def _early(files: dict[str, str], **extra) -> SearchConfig:
    return SearchConfig.from_dict(_base(files, **extra))


def test_early_stopping_is_on_by_default_off_with_false_and_a_mapping_sets_the_rungs(files):
    default = _early(files).early_stopping
    assert default.enabled and default.rungs == (0.1, 0.33, 1.0)
    assert default.reduction_factor == 3 and default.min_rows == 32
    assert _early(files, early_stopping=True).early_stopping == default
    assert not _early(files, early_stopping=False).early_stopping.enabled
    custom = _early(
        files, early_stopping={"rungs": [0.25, 1], "reduction_factor": 2, "min_rows": 8}
    ).early_stopping
    assert custom.enabled and custom.rungs == (0.25, 1.0)
    assert custom.reduction_factor == 2.0 and custom.min_rows == 8
    assert _early(files, early_stopping={}).early_stopping == default


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        ("yes", "early_stopping", "expected true, false or a mapping"),
        ({"rungs": [0.5, 0.2, 1.0]}, "early_stopping.rungs", "increasing fractions"),
        ({"rungs": [0.1, 0.5]}, "early_stopping.rungs", "ending with 1.0"),
        ({"rungs": [1.0]}, "early_stopping.rungs", "expected increasing"),
        ({"rungs": [0, 1]}, "early_stopping.rungs", "in (0, 1]"),
        ({"rungs": "0.1,1"}, "early_stopping.rungs", "got '0.1,1'"),
        ({"reduction_factor": 1}, "early_stopping.reduction_factor", "a number > 1, got 1"),
        ({"reduction_factor": True}, "early_stopping.reduction_factor", "a number > 1"),
        ({"min_rows": 0}, "early_stopping.min_rows", "an integer >= 1, got 0"),
        ({"min_rows": -1}, "early_stopping.min_rows", "an integer >= 1, got -1"),
        ({"rung": [0.1, 1.0]}, "early_stopping.rung", "did you mean 'rungs'"),
    ],
)
def test_bad_early_stopping_values_are_one_line_naming_the_key(files, value, path, message):
    with pytest.raises(ConfigError) as info:
        _early(files, early_stopping=value)
    assert info.value.path == path
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_command_line_exits_2_on_a_bad_early_stopping_value(tmp_path, files, capsys):
    config = tmp_path / "config.yaml"
    raw = {**files, "search_space": {"per_channel": [True]}, "early_stopping": {"rungs": [2]}}
    config.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "early_stopping.rungs: expected increasing fractions in (0, 1] ending with 1.0, got [2]"
    )


def test_keep_candidates_is_a_count_of_models_3_by_default(files):
    def kept(**extra) -> int | None:
        return SearchConfig.from_dict(_base(files, **extra)).keep_candidates

    assert kept() == 3
    assert kept(keep_candidates=0) == 0 and kept(keep_candidates=12) == 12
    # What the key meant when it was a switch: every candidate's model, or none.
    assert kept(keep_candidates=True) is None and kept(keep_candidates=False) == 0


@pytest.mark.parametrize("value", [-1, 2.5, "3", None, [3]])
def test_a_bad_keep_candidates_is_one_line_naming_the_key(files, value):
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(_base(files, keep_candidates=value))
    assert info.value.path == "keep_candidates"
    assert str(info.value) == (
        f"keep_candidates: expected an integer >= 0 (the candidate models kept), got {value!r}"
    )


def test_the_command_line_exits_2_on_a_bad_keep_candidates(tmp_path, files, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_base(files)))
    assert main(["validate", str(config), "keep_candidates=-2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "raysearch: error: keep_candidates: expected an integer >= 0 (the candidate models "
        "kept), got -2"
    ]


def test_objectives_and_select_parse_with_their_defaults(files):
    cfg = SearchConfig.from_dict(_base(files))
    assert cfg.objectives == ("metric",) and cfg.select == "metric"
    raw = _base(files, objectives=["Metric", "latency_ms", "model_size_mb"], select="Size")
    cfg = SearchConfig.from_dict(raw)
    assert cfg.objectives == ("metric", "latency_ms", "model_size_mb") and cfg.select == "size"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"objectives": ["metric", "latnecy_ms"]},
            "objectives[1]: unknown objective 'latnecy_ms' (did you mean 'latency_ms'?) "
            "(metric, latency_ms, model_size_mb)",
        ),
        (
            {"objectives": ["metric", "model_size_mb", "model_size_mb"]},
            "objectives[2]: model_size_mb is given twice",
        ),
        (
            {"objectives": ["latency_ms", "model_size_mb"]},
            "objectives: must hold metric (the tolerance decides the candidates by it)",
        ),
        (
            {"objectives": "metric"},
            "objectives: expected a list of metric, latency_ms, model_size_mb, got 'metric'",
        ),
        (
            {"objectives": ["metric", "latency_ms"], "measure_latency": False},
            "objectives: latency_ms needs measure_latency: true",
        ),
        ({"select": "fastest"}, "select: expected metric, latency, size, got 'fastest'"),
        (
            {"select": "latency", "measure_latency": False},
            "select: latency needs measure_latency: true",
        ),
    ],
)
def test_objectives_and_select_refusals_are_one_line(files, changes, message):
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(_base(files, **changes))
    assert str(info.value) == message


def test_retime_latency_is_auto_unless_set(files):
    assert SearchConfig.from_dict(_base(files)).retime_latency is None
    assert SearchConfig.from_dict(_base(files, retime_latency="Auto")).retime_latency is None
    for value in (True, False):
        assert SearchConfig.from_dict(_base(files, retime_latency=value)).retime_latency is value


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"retime_latency": "always"},
            "retime_latency: expected true, false or auto, got 'always'",
        ),
        (
            {"retime_latency": True, "measure_latency": False},
            "retime_latency: true needs measure_latency: true",
        ),
        (
            {"retime_latency": True, "resources": {"gpu_per_trial": 0.5}},
            "retime_latency: true times on the driver's CPU, and the trials run on GPUs "
            "(resources.gpu_per_trial)",
        ),
    ],
)
def test_retime_latency_refusals_are_one_line(files, changes, message):
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(_base(files, **changes))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("algo", "line"),
    [
        (
            "nsga2",
            "objectives: NSGAII samples on every objective (metric, model_size_mb); the "
            "Pareto front (pareto.parquet) and select use them too",
        ),
        (
            "Grid",
            "objectives: Grid orders its trials by the metric; the Pareto front "
            "(pareto.parquet) and select use every objective (metric, model_size_mb)",
        ),
    ],
)
def test_several_objectives_say_in_one_line_what_samples_on_them(files, caplog, algo, line):
    import logging

    raw = _base(files, objectives=["metric", "model_size_mb"], search_algo=algo)
    with caplog.at_level(logging.INFO, logger="raysearch.config.dialects"):
        SearchConfig.from_dict(raw)
    lines = [r.getMessage() for r in caplog.records if r.name == "raysearch.config.dialects"]
    assert lines == [line]


def test_a_single_objective_sampler_is_refused_with_several_objectives(files):
    raw = _base(files, objectives=["metric", "latency_ms"], search_algo="CmaEs")
    with pytest.raises(ConfigError) as info:
        SearchConfig.from_dict(raw)
    assert str(info.value) == (
        "search_algo: CmaEs optimises one objective, and objectives lists 2; use one of "
        "Random, TPE, GPS, NSGAII, QMC, or objectives: [metric]"
    )
