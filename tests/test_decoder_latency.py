"""A language-model metric's trial times a one-token decode step and a prefill besides its
batch (``decode_latency_ms``, ``prefill_latency_ms``), on the feeds the metric path fills in
(empty past); any other metric's trial records neither; both reach ``results.parquet`` and
can be objectives (no Ray: the trial engine runs here)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from raysearch.config._objectives import parse_objectives
from raysearch.data import DataSource, latency_feeds
from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from raysearch.outputs import results_table
from raysearch.ranking import best_record, pareto_front
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec
from raysearch.trialrecord import TrialRecord
from tests.lm_models import VOCAB, make_decoder_lm

SEQ = 12


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_latency")
    path = make_decoder_lm(folder / "lm.onnx")
    rng = np.random.default_rng(5)
    ids = rng.zipf(1.5, (8, SEQ)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(folder / "text.npz", input_ids=ids)
    return path, DataSource.load(folder / "text.npz", path, batch_size=4)


def test_feeds_are_one_token_and_the_data_length_with_an_empty_past(decoder):
    _, data = decoder
    feeds = latency_feeds(data.arrays, data.inputs)
    assert feeds is not None
    decode, prefill = feeds["decode"], feeds["prefill"]
    # The tiny decoder has 64 positions and the data 12 tokens: the prefill is the data's.
    assert decode["input_ids"].tolist() == data.arrays["input_ids"][:1, :1].tolist()
    assert prefill["input_ids"].tolist() == data.arrays["input_ids"][:1].tolist()
    assert decode["attention_mask"].shape == (1, 1) and prefill["position_ids"].shape == (1, SEQ)
    assert prefill["position_ids"][0].tolist() == list(range(SEQ))
    assert decode["past_key_values.0.key"].shape == (1, 2, 0, 16)
    assert set(decode) == {spec.name for spec in data.inputs}
    shorter = latency_feeds(data.arrays, data.inputs, prefill=5)
    assert shorter is not None and shorter["prefill"]["input_ids"].shape == (1, 5)


def test_an_lm_trial_records_decode_and_prefill_latency(decoder, tmp_path):
    path, data = decoder
    runner = TrialRunner(
        TrialSpec(path, data, data, Evaluator("kl", 0.05), device=TrialDevice(threads=1))
    )
    result = runner.run({"quantizer": "weight_only", "bits": 4}, tmp_path / "q4.onnx")
    assert result.status == "ok", result.error
    assert result.decode_latency_ms is not None and result.decode_latency_ms > 0
    assert result.prefill_latency_ms is not None and result.prefill_latency_ms > 0
    record = result.replace(trial_id="t0", number=0)
    row = results_table([record]).to_pylist()[0]
    assert row["decode_latency_ms"] == pytest.approx(result.decode_latency_ms)
    assert row["prefill_latency_ms"] == pytest.approx(result.prefill_latency_ms)


def test_other_metrics_and_unmeasured_latency_record_neither(decoder, tmp_path):
    path, data = decoder
    for evaluator, measure in ((Evaluator("cos", 0.9), True), (Evaluator("kl", 0.05), False)):
        spec = TrialSpec(path, data, data, evaluator, measure_latency=measure)
        result = TrialRunner(spec).run({"quantizer": "weight_only"}, tmp_path / "q.onnx")
        assert result.status == "ok", result.error
        assert result.decode_latency_ms is None and result.prefill_latency_ms is None
        row = results_table([result.replace(trial_id="t", number=0)]).to_pylist()[0]
        assert row["decode_latency_ms"] is None and row["prefill_latency_ms"] is None


def test_decoder_latencies_are_objectives_and_selects_of_an_lm_metric():
    objectives, select = parse_objectives(
        {
            "metric": "kl",
            "objectives": ["metric", "model_size_mb", "decode_latency_ms"],
            "select": "prefill_latency",
        }
    )
    assert objectives == ("metric", "model_size_mb", "decode_latency_ms")
    assert select == "prefill_latency"
    with pytest.raises(ConfigError, match="decode_latency_ms needs a language-model metric"):
        parse_objectives({"metric": "cos", "objectives": ["metric", "decode_latency_ms"]})
    with pytest.raises(ConfigError, match="prefill_latency_ms needs measure_latency: true"):
        parse_objectives(
            {
                "metric": "kl",
                "objectives": ["metric", "prefill_latency_ms"],
                "measure_latency": False,
            }
        )
    with pytest.raises(ConfigError, match="decode_latency needs a language-model metric"):
        parse_objectives({"metric": "L2", "select": "decode_latency"})
    # The front and best/ read the figures from the records.
    rows = [
        TrialRecord(trial_id=t, number=i, status="ok", is_candidate=True, metric=m).replace(
            model_size_bytes=2_000_000, decode_latency_ms=d, prefill_latency_ms=p
        )
        for i, (t, m, d, p) in enumerate([("a", 1e-4, 0.5, 9.0), ("b", 2e-4, 0.4, 9.5)])
    ]
    front = pareto_front(rows, ["metric", "decode_latency_ms"], False)
    assert [r.trial_id for r in front] == ["a", "b"]
    assert [r.trial_id for r in pareto_front(rows, ["metric", "prefill_latency_ms"], False)] == [
        "a"
    ]
    assert best_record(rows, False, "decode_latency").trial_id == "b"
    assert best_record(rows, False, "prefill_latency").trial_id == "a"


def _lm_config(tmp_path, path, metric="kl"):
    from raysearch.config import SearchConfig

    ids = np.random.default_rng(6).zipf(1.5, (8, SEQ)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(tmp_path / "text.npz", input_ids=ids)
    return SearchConfig.from_dict(
        {
            "model": str(path),
            "calibration_data": str(tmp_path / "text.npz"),
            "batch_size": 4,
            "search_space": {"quantizer": ["weight_only"], "block_size": [32, 64]},
            "search_algo": "Grid",
            "metric": metric,
            "tolerance": 0.5,
            "output_dir": str(tmp_path / "out"),
        }
    )


def test_the_float_model_and_the_best_figures_reach_the_summary(decoder, tmp_path):
    from raysearch.outputs import write_outputs
    from raysearch.search.preflight import preflight

    path, data = decoder
    config = _lm_config(tmp_path, path)
    info = preflight(config).info
    assert info["float_decode_latency_ms"] > 0 and info["float_prefill_latency_ms"] > 0
    other = preflight(_lm_config(tmp_path, path, metric="cos")).info
    assert "float_decode_latency_ms" not in other and "float_prefill_latency_ms" not in other
    runner = TrialRunner(TrialSpec(path, data, data, Evaluator("kl", 0.5)))
    result = runner.run({"quantizer": "weight_only"}, tmp_path / "q.onnx")
    record = result.replace(trial_id="t0", number=0, params={}, settings={})
    summary = write_outputs(
        tmp_path / "out", [record], config=config, stop_reason="space_exhausted", wall_time_s=1.0
    )
    assert summary["best_decode_latency_ms"] == result.decode_latency_ms
    assert summary["best_prefill_latency_ms"] == result.prefill_latency_ms
    # the best's metric with its 95 % interval (what the terminal prints beside it)
    assert summary["best_metric_interval"] == [
        result.extra["kl_ci_low"],
        result.extra["kl_ci_high"],
    ]


def test_max_decode_latency_keeps_a_slower_decoder_out_of_the_candidates(decoder, tmp_path):
    """Within the tolerance, a setting that decodes slower than ``max_decode_latency`` is not
    a candidate (and says why); without a bound, or under it, it is one."""
    from raysearch.trial import TrialDevice

    path, data = decoder
    settings = {"quantizer": "weight_only", "bits": 4}

    def run(bound):
        spec = TrialSpec(path, data, data, Evaluator("kl", 0.5), device=TrialDevice(threads=1),
                         max_decode_latency_ms=bound)  # fmt: skip
        return TrialRunner(spec).run(settings, tmp_path / f"q{bound}.onnx")

    free, slow, fast = run(None), run(1e-6), run(1e6)
    assert free.is_candidate and fast.is_candidate and "decode_over_bound" not in free.extra
    assert slow.status == "ok" and not slow.is_candidate
    assert slow.decode_latency_ms > 1e-6 and slow.extra["decode_over_bound"] == 1.0


def test_size_budget_keeps_a_larger_model_out_of_the_candidates(decoder, tmp_path):
    """Within the tolerance, a model larger than ``size_budget`` is not a candidate (and says
    why); within the budget it is one."""
    from raysearch.trial import TrialDevice

    path, data = decoder
    settings = {"quantizer": "weight_only", "bits": 4}

    def run(budget):
        spec = TrialSpec(path, data, data, Evaluator("kl", 0.5), device=TrialDevice(threads=1),
                         measure_latency=False, max_model_size_bytes=budget)  # fmt: skip
        return TrialRunner(spec).run(settings, tmp_path / f"q{budget}.onnx")

    within, over = run(10**9), run(1000)
    assert within.is_candidate and "size_over_budget" not in within.extra
    assert over.status == "ok" and not over.is_candidate
    assert over.model_size_bytes > 1000 and over.extra["size_over_budget"] == 1.0


def test_size_budget_builder_is_the_size_of_the_builders_int4(decoder, tmp_path):
    """``size_budget: builder`` is the size of the builder's int4 (RTN, block 32, symmetric,
    every weight MatMul) as the engine writes it into the search's cache, and megabytes are
    10**6 bytes."""
    from raysearch.config._objectives import parse_size_budget
    from raysearch.modelfile import model_size_bytes
    from raysearch.search._engine import build_engine, size_budget_bytes
    from raysearch.search.preflight import preflight

    path, _ = decoder
    config = _lm_config(tmp_path, path)
    config = dataclasses.replace(config, size_budget="builder", max_decode_latency=None)
    spec, _ = build_engine(config, str(tmp_path / "cache"), preflight(config))
    written = tmp_path / "cache" / "builder" / "model.onnx"
    assert spec.max_model_size_bytes == model_size_bytes(written) < model_size_bytes(path)
    assert spec.decode_anchor is None  # the decode step is not bounded by it
    assert size_budget_bytes(dataclasses.replace(config, size_budget=1.5)) == 1_500_000
    for value in (0, -1, "small", True):
        with pytest.raises(ConfigError, match="expected megabytes above 0 or 'builder'"):
            parse_size_budget({"size_budget": value})


def test_max_decode_latency_is_float_or_milliseconds_for_a_language_model_metric(tmp_path):
    from raysearch.config._objectives import parse_max_decode_latency

    assert parse_max_decode_latency({"metric": "KL", "max_decode_latency": "Float"}) == "float"
    assert parse_max_decode_latency({"metric": "kl", "max_decode_latency": 3}) == 3.0
    assert parse_max_decode_latency({"metric": "kl", "max_decode_latency": "BUILDER"}) == "builder"
    for value in (0, -1, "fast", True):
        with pytest.raises(ConfigError, match=r"expected 'float' .* or milliseconds above 0"):
            parse_max_decode_latency({"metric": "kl", "max_decode_latency": value})
    with pytest.raises(ConfigError, match="only kl, top1_agreement, perplexity time"):
        parse_max_decode_latency({"metric": "cos", "max_decode_latency": "float"})
    with pytest.raises(ConfigError, match="needs measure_latency: true"):
        parse_max_decode_latency(
            {"metric": "kl", "max_decode_latency": 2, "measure_latency": False}
        )


def test_max_decode_latency_float_is_the_float_models_decode_step(decoder, tmp_path):
    """``float`` reaches the trials as the float model's decode step timed by the preflight."""
    from raysearch.config import SearchConfig
    from raysearch.search._engine import build_engine
    from raysearch.search.preflight import preflight

    path, _ = decoder
    config = _lm_config(tmp_path, path)
    config = SearchConfig.from_dict({**config.raw, "max_decode_latency": "float"})
    prepared = preflight(config)
    spec, info = build_engine(config, str(tmp_path / "cache"), prepared)
    assert spec.max_decode_latency_ms == info["float_decode_latency_ms"] > 0


def test_max_decode_latency_builder_times_each_trial_against_the_builders_int4(decoder, tmp_path):
    """``builder``: the engine writes the builder's int4 of the model into the search's cache
    (RTN block 32 symmetric at accuracy_level 4, as the weight-only backend writes it) and
    times it alone for the summary; each trial then times its decode step in turn with that
    model's and is a candidate only when it is no slower."""
    from raysearch.config import SearchConfig
    from raysearch.quantize.backends.weight_only import WeightOnlyBackend
    from raysearch.search._engine import build_engine
    from raysearch.search.preflight import preflight

    path, data = decoder
    config = _lm_config(tmp_path, path)
    config = SearchConfig.from_dict({**config.raw, "max_decode_latency": "builder"})
    spec, info = build_engine(config, str(tmp_path / "cache"), preflight(config))
    anchor = spec.decode_anchor.path
    assert anchor == str(tmp_path / "cache" / "builder" / "model.onnx")
    assert spec.max_decode_latency_ms == info["builder_decode_latency_ms"] > 0
    with WeightOnlyBackend(path, data) as backend:
        backend.quantize({"block_size": 32, "symmetric": True, "accuracy_level": 4},
                         tmp_path / "b.onnx")  # fmt: skip
    import onnx

    def weights(p):
        return {t.name: t.raw_data for t in onnx.load(str(p)).graph.initializer}

    assert weights(anchor) == weights(tmp_path / "b.onnx")

    def run(settings, name):
        trial = TrialSpec(path, data, data, Evaluator("kl", 0.5), device=TrialDevice(threads=1),
                          decode_anchor_path=anchor)  # fmt: skip
        return TrialRunner(trial).run(settings, tmp_path / f"{name}.onnx")

    # 8-bit weights without int8 compute decode far slower: not a candidate
    slow = run({"quantizer": "weight_only", "bits": 8, "accuracy_level": 0}, "slow")
    assert slow.extra["builder_decode_latency_ms"] > 0 and slow.status == "ok"
    assert slow.decode_latency_ms > slow.extra["builder_decode_latency_ms"]
    assert not slow.is_candidate and slow.extra["decode_over_bound"] == 1.0


def test_no_candidate_for_a_bound_says_which_bound_not_a_missed_tolerance(decoder, tmp_path):
    """When settings met the tolerance but decoded slower than ``max_decode_latency`` or were
    larger than ``size_budget``, the summary says so instead of "missed it by 0"."""
    from raysearch.outputs import write_outputs

    path, _ = decoder
    config = _lm_config(tmp_path, path)
    rows = [
        TrialRecord(trial_id=t, number=i, status="ok", is_candidate=False, metric=m,
                    params={}, settings={}, model_size_bytes=1000, extra=extra)
        for i, (t, m, extra) in enumerate([
            ("a", 0.1, {"decode_over_bound": 1.0}),
            ("b", 0.2, {"size_over_budget": 1.0, "decode_over_bound": 1.0}),
            ("c", 0.9, {"decode_over_bound": 1.0}),  # outside the tolerance (0.5)
            ("d", 0.1, {"size_over_budget": 1.0}),  # a sensitivity probe: never a candidate
        ])
    ]  # fmt: skip
    rows[-1] = rows[-1].replace(stage="sensitivity")
    summary = write_outputs(
        tmp_path / "out", rows, config=config, stop_reason="space_exhausted", wall_time_s=1.0
    )
    assert summary["n_candidates"] == 0
    assert summary["tolerance_note"] == (
        "no candidate: of the 2 settings that met the tolerance, 2 decoded slower than "
        "max_decode_latency and 1 were larger than size_budget"
    )
