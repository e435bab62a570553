"""The language-model metrics (kl, top1_agreement, perplexity) against values computed by hand,
the logits output found by its vocabulary axis, the paired bootstrap intervals, the decoder
inputs filled in from ``input_ids`` alone, and a decoder with past-key-value inputs quantized
and scored by the trial engine (no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.metrics import (
    METRICS,
    MetricError,
    canonical_metric,
    compute_metric,
    logits_output,
    metric_interval,
    metric_per_sample,
)
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec
from tests.lm_models import VOCAB, make_decoder_lm


def _softmax(row):
    e = [math.exp(v - max(row)) for v in row]
    return [v / sum(e) for v in e]


# Two sequences of three positions over a vocabulary of four, by hand.
F = np.array(
    [
        [[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 3.0, 0.5, 0.0]],
        [[0.5, 0.2, 0.1, 0.0], [4.0, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0]],
    ]
)
Q = np.array(
    [
        [[1.8, 1.1, 0.1, -1.0], [0.1, -0.1, 0.0, 0.2], [1.2, 2.9, 0.4, 0.0]],
        [[0.2, 0.5, 0.1, 0.0], [3.5, 0.2, 1.0, 2.1], [0.0, 1.1, 2.0, 2.9]],
    ]
)
IDS = np.array([[0, 1, 3], [2, 0, 1]])


def _kl_by_hand(f, q):
    p, r = _softmax(list(f)), _softmax(list(q))
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, r))


def test_kl_is_the_mean_over_positions_of_kl_float_quantized():
    by_hand = [np.mean([_kl_by_hand(F[s, t], Q[s, t]) for t in range(3)]) for s in range(2)]
    values = metric_per_sample("kl", {"logits": Q}, {"logits": F})
    np.testing.assert_allclose(values, by_hand, rtol=1e-12)
    assert compute_metric("kl", {"logits": Q}, {"logits": F}) == pytest.approx(np.mean(by_hand))
    assert compute_metric("kl", {"logits": F}, {"logits": F}) == pytest.approx(0.0, abs=1e-15)


def test_top1_agreement_counts_positions_with_the_same_argmax():
    # sequence 0: argmax F = 0, 0 (tie: first), 1; Q = 0, 3, 1 -> 2/3; sequence 1: F = 0, 0, 3;
    # Q = 1, 0, 3 -> 2/3
    values = metric_per_sample("top1_agreement", {"logits": Q}, {"logits": F})
    np.testing.assert_allclose(values, [2 / 3, 2 / 3])


def test_perplexity_reads_the_next_token_from_input_ids():
    nll = []
    for s in range(2):
        terms = [-math.log(_softmax(list(Q[s, t]))[IDS[s, t + 1]]) for t in range(2)]
        nll.append(np.mean(terms))
    values = metric_per_sample("perplexity", {"logits": Q}, {"logits": F}, {"input_ids": IDS})
    np.testing.assert_allclose(values, nll, rtol=1e-12)
    got = compute_metric("perplexity", {"logits": Q}, {"logits": F}, {"input_ids": IDS})
    assert got == pytest.approx(math.exp(np.mean(nll)))
    with pytest.raises(MetricError, match="input_ids"):
        compute_metric("perplexity", {"logits": Q}, {"logits": F})


def test_logits_found_by_the_vocabulary_axis_beside_a_kv_cache():
    cache = np.zeros((2, 2, 3, 16))
    outputs = {"present.0.key": cache, "scores": F}
    assert logits_output(outputs) == "scores"
    quantized = {"present.0.key": cache + 5.0, "scores": Q}
    # the cache outputs play no part
    assert compute_metric("kl", quantized, outputs) == compute_metric(
        "kl", {"logits": Q}, {"logits": F}
    )
    with pytest.raises(MetricError, match="vocabulary axis"):
        logits_output({"y": np.zeros((2, 3))})


def test_names_directions_and_aliases():
    assert canonical_metric("KL") == "kl" and canonical_metric("ppl") == "perplexity"
    assert canonical_metric("top1") == "top1_agreement"
    assert not METRICS["kl"].higher_is_better and METRICS["top1_agreement"].higher_is_better
    assert not METRICS["perplexity"].higher_is_better


def test_bootstrap_interval_is_paired_and_brackets_the_metric():
    rng = np.random.default_rng(3)
    a = rng.gamma(2.0, 1e-3, 64)
    b = a * 1.5
    low_a, high_a = metric_interval("kl", a)
    low_b, high_b = metric_interval("kl", b)
    assert low_a < a.mean() < high_a
    # the same draws for both (paired): b's bounds are a's scaled
    assert low_b == pytest.approx(1.5 * low_a) and high_b == pytest.approx(1.5 * high_a)
    assert metric_interval("kl", np.full(10, 0.25)) == pytest.approx((0.25, 0.25))
    nll = np.array([1.0, 2.0, 3.0])
    low, high = metric_interval("perplexity", nll)
    assert math.exp(1.0) <= low < math.exp(2.0) < high <= math.exp(3.0)


def test_evaluator_score_carries_every_lm_metric_with_intervals():
    score = Evaluator("kl", tolerance=0.01).score(
        outputs={"logits": Q}, reference={"logits": F}, inputs={"input_ids": IDS}
    )
    assert score.metric == pytest.approx(compute_metric("kl", {"logits": Q}, {"logits": F}))
    for name in ("kl", "top1_agreement", "perplexity"):
        assert score.extra[f"{name}_ci_low"] <= score.extra[name] <= score.extra[f"{name}_ci_high"]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm")
    path = make_decoder_lm(folder / "lm.onnx")
    rng = np.random.default_rng(5)
    ids = rng.zipf(1.5, (8, 12)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(folder / "text.npz", input_ids=ids)
    return path, folder / "text.npz"


def test_decoder_inputs_filled_from_input_ids(decoder):
    path, text = decoder
    data = DataSource.load(text, path, batch_size=4)
    assert data.arrays["attention_mask"].tolist() == np.ones((8, 12), np.int64).tolist()
    assert data.arrays["position_ids"][3].tolist() == list(range(12))
    assert data.arrays["past_key_values.1.value"].shape == (8, 2, 0, 16)


def test_decoder_with_past_inputs_quantized_and_scored(decoder, tmp_path):
    path, text = decoder
    data = DataSource.load(text, path, batch_size=4)
    runner = TrialRunner(
        TrialSpec(path, data, data, Evaluator("kl", 0.05), device=TrialDevice(threads=1))
    )
    float_like = runner.run({"quantizer": "weight_only", "bits": 8}, tmp_path / "q8.onnx")
    coarse = runner.run(
        {"quantizer": "weight_only", "block_size": 64, "symmetric": True}, tmp_path / "q4.onnx"
    )
    for result in (float_like, coarse):
        assert result.status == "ok", result.error
        extra = result.extra
        assert extra["kl_ci_low"] <= result.metric <= extra["kl_ci_high"]
        assert 0.5 < extra["top1_agreement"] <= 1.0 and extra["perplexity"] > 1.0
    assert 0 < float_like.metric < coarse.metric
    assert float_like.extra["top1_agreement"] >= coarse.extra["top1_agreement"]
    assert float_like.is_candidate
