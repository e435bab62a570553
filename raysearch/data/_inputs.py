"""A model's inputs: what a caller must feed (graph inputs that are not initializers).

Example:
    >>> ModelInput("x", np.dtype("float32"), ("N", 4)).shape_text()
    '[N, 4]'
    >>> [i.name for i in model_inputs("model.onnx")]     # doctest: +SKIP
    ['bytes']
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx

from raysearch.errors import DataError
from raysearch.modelfile import load_header

__all__ = ["ModelInput", "model_inputs"]


@dataclass(frozen=True)
class ModelInput:
    """One model input: its name, numpy dtype and shape (an ``int`` per static dimension, the
    dimension's symbolic name or ``None`` per dynamic one; the whole shape is ``None`` when the
    model does not declare it, and the data's shape is then taken as it is, batch axis first)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    @property
    def has_dynamic_batch(self) -> bool:
        """True when the first dimension is dynamic (a batch axis of any size)."""
        return bool(self.shape) and not isinstance(self.shape[0], int)

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


def model_inputs(model: str | os.PathLike | onnx.ModelProto) -> list[ModelInput]:
    """The inputs a caller must feed: graph inputs minus initializers, in graph order.

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
    return found
