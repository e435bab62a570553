"""The inputs a decoder exported the way Optimum and onnxruntime-genai export it takes beside
its tokens, filled in when the data gives ``input_ids`` alone: ``attention_mask`` (every
position attended), ``position_ids`` (``0..seq-1``) and each ``past_key_values.*`` /
``past_key*`` / ``past_value*`` input as an empty past (its dynamic past axis 0). A language
model is then evaluated on whole windows of text, as a first forward pass sees them.

Example:
    >>> import numpy as np
    >>> from raysearch.data._inputs import ModelInput
    >>> specs = [ModelInput("input_ids", np.dtype("int64"), ("b", "s")),
    ...          ModelInput("past_key_values.0.key", np.dtype("float32"), ("b", 2, "p", 8))]
    >>> filled = complete_decoder_inputs({"input_ids": np.zeros((3, 5), np.int64)}, specs)
    >>> filled["past_key_values.0.key"].shape
    (3, 2, 0, 8)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from raysearch.data._inputs import ModelInput

__all__ = ["complete_decoder_inputs", "is_past_input"]

_PAST = re.compile(r"^(past_key_values[._]|past_key|past_value|past\.)")


def is_past_input(name: str) -> bool:
    """Whether input ``name`` is a key/value cache input (Optimum's and genai's names)."""
    return bool(_PAST.match(name))


def complete_decoder_inputs(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput]
) -> dict[str, np.ndarray]:
    """``arrays`` with the decoder inputs the model takes and the data lacks filled in (see
    the module); unchanged when ``input_ids`` is missing or nothing else is."""
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
