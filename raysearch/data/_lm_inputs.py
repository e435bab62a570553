"""The inputs a decoder exported by Optimum or onnxruntime-genai takes beside its tokens,
filled in when the data gives ``input_ids`` alone: ``attention_mask`` (all attended),
``position_ids`` and each past key/value input as an empty past; and :func:`latency_feeds`,
the one-token decode step and the prefill a decoder's speed is timed on.

Example:
    >>> import numpy as np
    >>> from raysearch.data._inputs import ModelInput, is_past_input
    >>> specs = [ModelInput("input_ids", np.dtype("int64"), ("b", "s")),
    ...          ModelInput("past_key_values.0.key", np.dtype("float32"), ("b", 2, "p", 8))]
    >>> filled = complete_decoder_inputs({"input_ids": np.zeros((3, 5), np.int64)}, specs)
    >>> filled["past_key_values.0.key"].shape
    (3, 2, 0, 8)
    >>> feeds = latency_feeds({"input_ids": np.zeros((3, 200), np.int64)}, specs)
    >>> feeds["decode"]["input_ids"].shape, feeds["prefill"]["past_key_values.0.key"].shape
    ((1, 1), (1, 2, 0, 8))
    >>> feeds["prefill"]["input_ids"].shape
    (1, 128)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from raysearch.data._inputs import ModelInput, is_past_input

__all__ = [
    "complete_decoder_inputs",
    "latency_feeds",
    "past_outputs",
    "next_step_feed",
    "PREFILL_TOKENS",
]

#: The longest prefill a decoder is timed on (:func:`latency_feeds`).
PREFILL_TOKENS = 128


def complete_decoder_inputs(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput]
) -> dict[str, np.ndarray]:
    """``arrays`` with the decoder inputs the model takes and the data lacks filled in."""
    out = dict(arrays)
    ids = out.get("input_ids")
    if ids is None or ids.ndim != 2:
        return out
    rows, seq = ids.shape
    for spec in inputs:
        if spec.name in out:
            continue
        dtype = spec.dtype
        if spec.name == "attention_mask":
            out[spec.name] = np.ones((rows, seq), dtype)
        elif spec.name == "position_ids":
            out[spec.name] = np.broadcast_to(np.arange(seq, dtype=dtype), (rows, seq)).copy()
        elif is_past_input(spec.name) and spec.shape:
            # batch first; a fixed size stays; any other dynamic axis is the past: empty.
            shape = [rows] + [d if isinstance(d, int) else 0 for d in spec.shape[1:]]
            out[spec.name] = np.zeros(shape, dtype)
    return out


def latency_feeds(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput], prefill: int = PREFILL_TOKENS
) -> dict[str, dict[str, np.ndarray]] | None:
    """The feeds a decoder is timed on: ``decode``, the first token of the data's first
    sequence, and ``prefill``, its first ``min(prefill, seq)`` tokens, each with an empty past.
    None when the data has no ``[rows, seq]`` ``input_ids``, the model takes another input,
    or fixes its batch above one or its sequence length."""
    ids = arrays.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        return None
    spec = next((s for s in inputs if s.name == "input_ids"), None)
    if spec is not None and spec.shape is not None:
        batch, seq = (spec.shape + (None, None))[:2]
        if len(spec.shape) != 2 or isinstance(seq, int) or (isinstance(batch, int) and batch != 1):
            return None
    feeds = {}
    for name, tokens in (("decode", 1), ("prefill", min(int(prefill), ids.shape[1]))):
        first = np.ascontiguousarray(ids[:1, :tokens])
        feed = complete_decoder_inputs({"input_ids": first}, inputs)
        if any(s.name not in feed for s in inputs):
            return None
        feeds[name] = feed
    return feeds


def _cache_slot(name: str) -> tuple[str, str] | None:
    """(layer number, key or value) of a cache input or output name."""
    match = re.search(r"(\d+)\D*?(key|value)", name)
    return (match.group(1), match.group(2)) if match else None


def past_outputs(inputs: Sequence[ModelInput], outputs: Sequence[str]) -> dict[str, str] | None:
    """Which output of a decoder becomes each cache input at the next step (matched by layer
    and key/value); None when the model has no cache inputs or an output is missing."""
    past = [s.name for s in inputs if is_past_input(s.name)]
    if not past:
        return None
    by_slot = {_cache_slot(o): o for o in outputs if "present" in o and _cache_slot(o)}
    mapping = {}
    for name in past:
        output = by_slot.get(_cache_slot(name)) if _cache_slot(name) else None
        if output is None:
            return None
        mapping[name] = output
    return mapping


def next_step_feed(
    feed: Mapping[str, np.ndarray],
    present: Mapping[str, np.ndarray],
    token: int,
) -> dict[str, np.ndarray]:
    """The feed of the decode step after ``feed``: one token (``input_ids [1, 1]``) against
    the cache the last step wrote (``present``: each cache input's new value), the attention
    mask one longer and the position the next one."""
    step = dict(feed)
    ids = feed["input_ids"]
    step["input_ids"] = np.full((ids.shape[0], 1), token, ids.dtype)
    step.update(present)
    if "attention_mask" in feed:
        mask = feed["attention_mask"]
        step["attention_mask"] = np.ones((mask.shape[0], mask.shape[1] + 1), mask.dtype)
    if "position_ids" in feed:
        pos = feed["position_ids"]
        step["position_ids"] = pos[:, -1:] + 1
    return step
