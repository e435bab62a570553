"""Latency that decides, or that the summary sets against the float model's, is timed again
alone after the search, with its spread; a best setting slower than the float model is said
(issue 48, item 5)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import quantize_dynamic

from raysearch.config import SearchConfig
from raysearch.data import DataSource
from raysearch.ranking import best_record
from raysearch.search._retime import ROUNDS, RUNS, retime, slower_than_float_note
from raysearch.trialrecord import TrialRecord
from tests.models import make_mlp_model, mlp_data


def test_a_best_slower_than_float_is_said_word_for_word():
    assert slower_than_float_note(4.94) == (
        "the best setting is slower than the float model: 494% of its latency, each timed "
        "alone after the search (select: latency, or objectives with latency_ms, weighs speed)"
    )
    assert slower_than_float_note(1.5, deciding=True) == (
        "the best setting is slower than the float model: 150% of its latency, each timed "
        "alone after the search (no candidate timed was faster)"
    )
    assert slower_than_float_note(0.99) is None and slower_than_float_note(None) is None


@pytest.fixture
def searched(tmp_path: Path) -> dict:
    """A float MLP and two of its quantized models in a search folder, as trials left them,
    with the figures the trials timed while they shared the CPU."""
    model = make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(32))
    (tmp_path / "out" / "candidates").mkdir(parents=True)
    records = []
    for n, (trial, per_channel) in enumerate((("aaaa0001", True), ("aaaa0002", False))):
        path = tmp_path / "out" / "candidates" / f"{trial}.onnx"
        quantize_dynamic(str(model), str(path), per_channel=per_channel)
        records.append(
            TrialRecord(
                trial_id=trial,
                number=n,
                status="ok",
                metric=0.01 + n * 0.001,
                is_candidate=True,
                latency_ms=900.0 + n,  # timed under contention
                model_size_bytes=path.stat().st_size,
                model_file=f"candidates/{trial}.onnx",
                params={"per_channel": per_channel},
            )
        )
    return {"model": model, "folder": tmp_path, "records": records}


def _config(searched: dict, **extra) -> SearchConfig:
    folder = searched["folder"]
    return SearchConfig.from_dict(
        {
            "model": str(searched["model"]),
            "calibration_data": str(folder / "calib.npz"),
            "search_space": {"per_channel": [True, False]},
            "search_algo": "Grid",
            "tolerance": 1.0,
            "output_dir": str(folder / "out"),
            **extra,
        }
    )


def _evaluation(config: SearchConfig) -> DataSource:
    from raysearch.data import model_inputs
    from raysearch.search.preflight import check_model

    inputs = model_inputs(check_model(config.model))
    return DataSource.load(config.calibration_data, inputs, config.batch_size)


@pytest.mark.parametrize("select", ["latency", "metric"])
def test_the_models_that_count_are_timed_again_alone_with_their_spread(searched, select):
    # select: metric times the best and the float model alone only when the config asks.
    asked = {} if select == "latency" else {"retime_latency": True}
    config = _config(searched, select=select, **asked)
    retimed = retime(
        config, config.output_dir, searched["records"], _evaluation(config), config.model
    )
    assert retimed is not None
    how = retimed.summary["latency_retimed"]
    assert (how["rounds"], how["runs_per_round"], how["threads"]) == (ROUNDS, RUNS, 1)
    assert how["decides"] is (select == "latency")
    # select: latency decides between every candidate; select: metric times the best alone.
    timed = {"float", "aaaa0001", "aaaa0002"} if select == "latency" else {"float", "aaaa0001"}
    assert set(how["models"]) == timed
    for name, figures in how["models"].items():
        assert 0 < figures["min_ms"] <= figures["median_ms"] <= figures["max_ms"]
        if name != "float":
            assert figures["in_search_ms"] == 900.0 + int(name[-1]) - 1
    assert retimed.float_ms["latency_ms"] == how["models"]["float"]["median_ms"]
    by_id = {r.trial_id: r for r in retimed.records}
    for trial in timed - {"float"}:
        assert by_id[trial].latency_ms == how["models"][trial]["median_ms"]
    best = (
        "aaaa0001"
        if select == "metric"
        else min(("aaaa0001", "aaaa0002"), key=lambda t: how["models"][t]["median_ms"])
    )
    assert retimed.summary["best_latency_vs_float"] == round(
        how["models"][best]["median_ms"] / how["models"]["float"]["median_ms"], 4
    )
    # The journal's records are left as they were.
    assert searched["records"][0].latency_ms == 900.0


@pytest.mark.parametrize(
    "extra",
    [
        {},  # latency decides nothing: the figures of the search are reported
        {"select": "size", "objectives": ["metric", "model_size_mb"]},
        {"select": "latency", "retime_latency": False},  # asked not to: the trials' figures
    ],
)
def test_nothing_is_timed_again_where_latency_decides_nothing_unless_asked(searched, extra):
    config = _config(searched, **extra)
    evaluation = _evaluation(config)
    assert retime(config, config.output_dir, searched["records"], evaluation, config.model) is None


def test_the_timing_process_answers_what_onnx_runtime_refuses_and_ends(searched, caplog):
    from raysearch.search._latency_timer import LatencyTimer
    from raysearch.search._retime import plan_retime

    config = _config(searched, select="latency")
    folder = searched["folder"]
    (folder / "broken.onnx").write_bytes(b"not a model")
    plan = plan_retime(config, config.output_dir, searched["records"], _evaluation(config), "x")
    assert plan is not None and set(plan.job["paths"]) == {"float", "aaaa0001", "aaaa0002"}
    timer = LatencyTimer()
    timer.submit({**plan.job, "paths": {**plan.job["paths"], "float": folder / "broken.onnx"}})
    process = timer._process
    with caplog.at_level("WARNING", logger="raysearch.search"):
        assert plan.apply(timer.result()) is None  # the trials' figures stay
    assert process.returncode == 0 and timer._process is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("latency could not be timed again alone: ") and "broken.onnx" in line


def test_nothing_is_timed_again_without_latency_or_on_gpus(searched):
    for extra in ({"measure_latency": False}, {"resources": {"gpu_per_trial": 1}}):
        config = _config(searched, **extra)
        evaluation = _evaluation(config)
        assert retime(config, config.output_dir, searched["records"], evaluation, "x") is None


@pytest.mark.slow
def test_a_search_says_its_latency_timed_alone_in_summary_and_terminal(
    ray_cluster, make_config, tmp_path, capsys
):
    import yaml

    from raysearch.cli import main

    config = make_config(
        search_space={"per_channel": [True, False]},
        select="latency",
        early_stopping=False,
        tolerance=1.0,
        resources={"max_concurrent_trials": 1},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path)]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    how = summary["latency_retimed"]
    # select: latency: every candidate and the float model timed again alone
    assert how["decides"] is True and set(how["models"]) == {"float", *_trial_ids(tmp_path)}
    assert summary["latency_timing"] == "timed alone after the search"
    assert summary["float_latency_ms"] == how["models"]["float"]["median_ms"]
    ratio = summary["best_latency_vs_float"]
    assert ratio == round(
        how["models"][summary["best_trial_id"]]["median_ms"] / summary["float_latency_ms"], 4
    )
    assert summary["latency_note"] == slower_than_float_note(ratio, deciding=True)
    out = capsys.readouterr().out.splitlines()
    spread = [line for line in out if line.startswith("  latency: ")]
    assert len(spread) == 1 and re.search(
        r", both timed alone after the search: \S+-\S+ ms against \S+-\S+ ms over 5 rounds$",
        spread[0],
    ), out


def _trial_ids(folder: Path) -> set[str]:
    import pyarrow.parquet as pq

    return set(pq.read_table(folder / "out" / "results.parquet")["trial_id"].to_pylist())


def test_show_prints_the_spread_of_latency_timed_alone(tmp_path, capsys):
    from raysearch.cli import main

    summary = {
        "stop_reason": "space_exhausted",
        "n_trials": 2,
        "n_failed": 0,
        "n_candidates": 2,
        "wall_time_s": 10.0,
        "metric": "L2",
        "best_metric": 0.01,
        "best_trial_id": "aaaa0001",
        "best_params": {"per_channel": True},
        "best_latency_ms": 2.5,
        "float_latency_ms": 0.5,
        "float_model_size_bytes": 1000,
        "best_latency_vs_float": 5.0,
        "latency_note": slower_than_float_note(5.0),
        "latency_retimed": {
            "decides": False,
            "rounds": 5,
            "runs_per_round": 5,
            "threads": 1,
            "models": {
                "float": {"median_ms": 0.5, "min_ms": 0.4, "max_ms": 0.7},
                "aaaa0001": {"median_ms": 2.5, "min_ms": 2.0, "max_ms": 3.0, "in_search_ms": 9},
            },
        },
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        "  latency: 2.5 ms per batch (500.0% of the float model's), both timed alone after the "
        "search: 2-3 ms against 0.4-0.7 ms over 5 rounds"
    ) in out
    assert (
        "Note: the best setting is slower than the float model: 500% of its latency, each timed "
        "alone after the search (select: latency, or objectives with latency_ms, weighs speed)."
    ) in out
    assert not any(re.match("Outputs: .*best/", line) for line in out)


@pytest.fixture(scope="module")
def decoder_searched(tmp_path_factory) -> dict:
    """A tiny decoder and two weight-only models of it in a search folder, with the decode
    and prefill figures the trials timed while they shared the CPU."""
    from raysearch.evaluate import Evaluator
    from raysearch.trial import TrialRunner, TrialSpec
    from tests.lm_models import VOCAB, make_decoder_lm

    folder = tmp_path_factory.mktemp("retime_lm")
    model = make_decoder_lm(folder / "lm.onnx")
    ids = np.random.default_rng(5).zipf(1.5, (8, 12)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(folder / "text.npz", input_ids=ids)
    data = DataSource.load(folder / "text.npz", model, batch_size=4)
    runner = TrialRunner(TrialSpec(model, data, data, Evaluator("kl", 0.5)))
    (folder / "out" / "candidates").mkdir(parents=True)
    records = []
    for n, block in enumerate((32, 64)):
        trial = f"bbbb000{n + 1}"
        result = runner.run(
            {"quantizer": "weight_only", "block_size": block},
            folder / "out" / "candidates" / f"{trial}.onnx",
        )
        assert result.status == "ok", result.error
        records.append(
            TrialRecord(
                trial_id=trial,
                number=n,
                status="ok",
                metric=0.01 + n * 0.001,
                is_candidate=True,
                extra={"quantized_share": 1.0},
                # timed under contention
                latency_ms=900.0 + n,
                decode_latency_ms=800.0 + n,
                prefill_latency_ms=700.0 + n,
                model_size_bytes=result.model_size_bytes,
                model_file=f"candidates/{trial}.onnx",
                params={"block_size": block},
            )
        )
    return {"model": model, "folder": folder, "records": records, "data": data}


@pytest.mark.parametrize(
    ("extra", "decides"),
    [
        ({"select": "decode_latency"}, "decode_latency_ms"),
        ({"objectives": ["metric", "prefill_latency_ms"]}, "prefill_latency_ms"),
        ({"retime_latency": True}, None),  # none decides: timed again as the config asks
    ],
)
def test_a_decoders_decode_and_prefill_are_timed_again_alone_as_latency_is(
    decoder_searched, extra, decides
):
    folder, records = decoder_searched["folder"], decoder_searched["records"]
    config = SearchConfig.from_dict(
        {
            "model": str(decoder_searched["model"]),
            "calibration_data": str(folder / "text.npz"),
            "batch_size": 4,
            "search_space": {"quantizer": ["weight_only"], "block_size": [32, 64]},
            "search_algo": "Grid",
            "metric": "kl",
            "tolerance": 0.5,
            "output_dir": str(folder / "out"),
            **extra,
        }
    )
    retimed = retime(config, config.output_dir, records, decoder_searched["data"], config.model)
    assert retimed is not None
    by_id = {r.trial_id: r for r in retimed.records}
    journaled = {r.trial_id: r for r in records}
    # best/ by the config's select, with the figures timed alone
    best = best_record(retimed.records, False, config.select).trial_id
    for figure, field in (
        ("latency_ms", "latency_retimed"),
        ("decode_latency_ms", "decode_latency_retimed"),
        ("prefill_latency_ms", "prefill_latency_retimed"),
    ):
        how = retimed.summary[field]
        assert how["decides"] is (figure == decides)
        assert (how["rounds"], how["runs_per_round"]) == (ROUNDS, RUNS)
        # where a figure decides every candidate is timed again for every figure (which is
        # the best is known once the deciding one is timed alone), else the best alone
        timed = {"float", "bbbb0001", "bbbb0002"} if decides else {"float", best}
        assert set(how["models"]) == timed
        assert retimed.float_ms[figure] == how["models"]["float"]["median_ms"]
        for name, figures in how["models"].items():
            assert 0 < figures["min_ms"] <= figures["median_ms"] <= figures["max_ms"] < 700
            if name != "float":  # the trial's figure kept beside the one timed alone
                assert getattr(by_id[name], figure) == figures["median_ms"]
                assert getattr(journaled[name], figure) == figures["in_search_ms"]
    assert records[0].decode_latency_ms == 800.0  # the journal's records as they were


@pytest.mark.slow
def test_a_decoder_search_times_its_decode_step_alone_where_it_decides(
    ray_cluster, decoder_searched, tmp_path, capsys
):
    import yaml

    from raysearch.cli import main

    folder = decoder_searched["folder"]
    config = {
        "model": str(decoder_searched["model"]),
        "calibration_data": str(folder / "text.npz"),
        "batch_size": 4,
        "search_space": {"quantizer": ["weight_only"], "block_size": [32, 64]},
        "search_algo": "Grid",
        "metric": "kl",
        "tolerance": 0.5,
        "select": "decode_latency",
        "max_decode_latency": None,  # both settings candidates, however fast they decode
        "early_stopping": False,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path)]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    how = summary["decode_latency_retimed"]
    assert how["decides"] is True and len(how["models"]) == 3  # float and both candidates
    assert summary["float_decode_latency_ms"] == how["models"]["float"]["median_ms"]
    best = summary["best_trial_id"]
    assert summary["best_decode_latency_ms"] == how["models"][best]["median_ms"]
    assert summary["prefill_latency_retimed"]["decides"] is False
    assert summary["best_metric_interval"][0] <= summary["best_metric"]
    out = capsys.readouterr().out.splitlines()
    spread = [line for line in out if line.startswith("  decode step: ")]
    assert len(spread) == 1 and re.search(
        r" ms per token \(.*\), both timed alone after the search: \S+-\S+ ms against \S+-\S+ "
        r"ms over \d rounds$",
        spread[0],
    ), out
