"""Running a model over evaluation data, and timing it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort

    from raysearch.data import DataSource

__all__ = ["run_model", "measure_latency", "measure_decoder_latency", "DECODER_LATENCY_RUNS"]

#: The timed runs (after one warm-up) of each decoder latency: a step is short.
DECODER_LATENCY_RUNS = 10
#: How many times the steps each model takes when timed against an ``anchor``.
ANCHORED_RUNS_FACTOR = 4


def run_model(
    session: ort.InferenceSession, data: DataSource
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Run ``session`` over every batch of ``data``: outputs concatenated over samples (stacked
    when each sample is one feed), and per-batch latencies in ms.
    """
    names = [o.name for o in session.get_outputs()]
    pieces: dict[str, list[np.ndarray]] = {n: [] for n in names}
    latencies: list[float] = []
    for feed in data.batches():
        start = time.perf_counter()
        results = session.run(None, feed)
        latencies.append((time.perf_counter() - start) * 1000.0)
        for name, value in zip(names, results):
            pieces[name].append(np.asarray(value))
    outputs = {}
    for name in names:
        parts = pieces[name]
        batched = (
            not data.sample_is_feed
            and all(p.ndim > 0 for p in parts)
            and sum(p.shape[0] for p in parts) == len(data)
        )
        outputs[name] = np.concatenate(parts, axis=0) if batched else np.stack(parts)
    return outputs, latencies


def measure_latency(
    session: ort.InferenceSession, feed: Mapping[str, np.ndarray], runs: int = 5
) -> float:
    """Median milliseconds of ``runs`` runs of one feed, after one warm-up run."""
    session.run(None, dict(feed))
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        session.run(None, dict(feed))
        times.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(times))


def measure_decoder_latency(
    session: ort.InferenceSession,
    data: DataSource,
    runs: int = DECODER_LATENCY_RUNS,
    anchor: ort.InferenceSession | None = None,
) -> dict[str, float]:
    """A decoder's median prefill (``prefill_latency_ms``, up to 128 tokens) and decode step
    (``decode_latency_ms``), after a warm-up: with a key/value cache as a client decodes,
    else on one token. With ``anchor`` both decode the same tokens in turn
    (:data:`ANCHORED_RUNS_FACTOR` times the steps; ``anchor_decode_latency_ms``). Empty when
    the model cannot take such feeds.
    """
    from raysearch.data import latency_feeds, next_step_feed, past_outputs

    feeds = latency_feeds(data.arrays, data.inputs)
    if feeds is None:
        return {}
    prefill = measure_latency(session, feeds["prefill"], runs=runs)
    names = [o.name for o in session.get_outputs()]
    cache = past_outputs(data.inputs, names)
    sessions = [session] if anchor is None else [session, anchor]
    keys = ["decode_latency_ms", "anchor_decode_latency_ms"][: len(sessions)]
    runs = max(1, runs) * (1 if anchor is None else ANCHORED_RUNS_FACTOR)
    times: dict[str, list[float]] = {k: [] for k in keys}
    if cache is None:
        for each in sessions:  # one warm-up each
            each.run(None, feeds["decode"])
        for step in range(runs):
            for i in _turns(len(sessions), step):
                start = time.perf_counter()
                sessions[i].run(None, dict(feeds["decode"]))
                times[keys[i]].append((time.perf_counter() - start) * 1000.0)
        return {**{k: float(np.median(v)) for k, v in times.items()}, "prefill_latency_ms": prefill}
    tokens = np.asarray(data.arrays["input_ids"])[0].ravel()
    # Against an anchor, both first decode the whole sequence untimed: a session opened for
    # the trial otherwise meets each cache length for the first time while the anchor's,
    # reused from trial to trial, has met them all.
    for timed in ([False, True] if anchor is not None else [True]):
        states = [(feeds["prefill"], dict(zip(names, s.run(None, feeds["prefill"]))))
                  for s in sessions]  # fmt: skip
        position = feeds["prefill"]["input_ids"].shape[1]
        for step in range(runs + 1):  # the first decode step is the warm-up
            token = int(tokens[position % tokens.size])
            for i in _turns(len(sessions), step):
                feed, outputs = states[i]
                feed = next_step_feed(feed, {p: outputs[o] for p, o in cache.items()}, token)
                start = time.perf_counter()
                outputs = dict(zip(names, sessions[i].run(None, feed)))
                if step and timed:
                    times[keys[i]].append((time.perf_counter() - start) * 1000.0)
                states[i] = (feed, outputs)
            position += 1
    return {**{k: float(np.median(v)) for k, v in times.items()}, "prefill_latency_ms": prefill}


def _turns(count: int, step: int) -> list[int]:
    """The order the models of a step run in: each first on every other step."""
    order = list(range(count))
    return order if step % 2 == 0 else order[::-1]
