"""A model's inputs: what a caller must feed (graph inputs that are not initializers).

Example:
    >>> ModelInput("x", np.dtype("float32"), ("N", 4)).shape_text()
    '[N, 4]'
    >>> [i.name for i in model_inputs("model.onnx")]     # doctest: +SKIP
    ['bytes']
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np
import onnx

from raysearch.errors import DataError
from raysearch.modelfile import load_header
from raysearch.modelfolder import cache_dims

__all__ = ["ModelInput", "model_inputs", "is_past_input"]

_PAST = re.compile(r"^(past_key_values[._]|past_key|past_value|past\.)")


def is_past_input(name: str) -> bool:
    """Whether input ``name`` is a key/value cache input (Optimum's and genai's names)."""
    return bool(_PAST.match(name))


@dataclass(frozen=True)
class ModelInput:
    """One model input: its name, numpy dtype and shape (an ``int`` per static dimension, the
    dimension's symbolic name or ``None`` per dynamic one; the whole shape is ``None`` when the
    model does not declare it, and the data's shape is then taken as it is, batch axis first)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    def shape_text(self) -> str:
        """The shape as users read it: ``[N, 4]`` (a dynamic dimension shows its name; ``any``
        when it has none, or only a name ONNX shape inference made up, ``unk__214``)."""
        if self.shape is None:
            return "(undeclared)"
        return "[" + ", ".join(_dim_text(d) for d in self.shape) + "]"


#: The prefix of the names ONNX shape inference gives dimensions it cannot name (``unk__214``):
#: internal, meaningless to the user.
_INFERRED_DIM_PREFIX = "unk__"


def _dim_text(dim: int | str | None) -> str:
    if isinstance(dim, int):
        return str(dim)
    if not dim or dim.startswith(_INFERRED_DIM_PREFIX):
        return "any"
    return dim


def model_inputs(
    model: str | os.PathLike | onnx.ModelProto, path: str | os.PathLike | None = None
) -> list[ModelInput]:
    """The inputs a caller must feed: graph inputs minus initializers, in graph order; a
    decoder's cache inputs with the head count and size its folder (beside ``model``, or
    ``path`` for a ``ModelProto`` read from there) or graph gives
    (:func:`raysearch.modelfolder.cache_dims`).

    Example:
        >>> [i.name for i in model_inputs("model.onnx")]     # doctest: +SKIP
        ['bytes']
    """
    proto = model if isinstance(model, onnx.ModelProto) else load_header(model)
    initializers = {init.name for init in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise DataError(f"model input '{value.name}' is not a tensor; raysearch feeds tensors")
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if not tensor.HasField("shape"):
            found.append(ModelInput(value.name, dtype, None))
            continue
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or None)
        found.append(ModelInput(value.name, dtype, tuple(dims)))
    return _with_cache_dims(found, path if isinstance(model, onnx.ModelProto) else model, proto)


def _with_cache_dims(
    found: list[ModelInput], path: str | os.PathLike | None, proto: onnx.ModelProto
) -> list[ModelInput]:
    """``found`` with the key/value cache inputs' symbolic head count and head size
    (``[batch, kv_heads, past, head_size]``) made the numbers the decoder has
    (:func:`raysearch.modelfolder.cache_dims`): onnxruntime-genai's builder names the head size
    ``kv_cache_dim``, and an empty past must still have it."""
    symbolic = [
        i
        for i in found
        if is_past_input(i.name)
        and i.shape
        and len(i.shape) == 4
        and not (isinstance(i.shape[1], int) and isinstance(i.shape[3], int))
    ]
    dims = cache_dims(path, proto) if symbolic else None
    if dims is None:
        return found
    fixed = {
        i.name: replace(
            i,
            shape=(
                i.shape[0],
                i.shape[1] if isinstance(i.shape[1], int) else dims.kv_heads,
                i.shape[2],
                i.shape[3] if isinstance(i.shape[3], int) else dims.head_size,
            ),
        )
        for i in symbolic
    }
    return [fixed.get(i.name, i) for i in found]
