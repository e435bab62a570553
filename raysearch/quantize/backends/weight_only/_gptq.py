"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers") for ``algorithm: gptq``, written here because no library reachable
rounds an ONNX model's weights by it correctly (ONNX Runtime's GPTQ carries no rounding error;
NNCF's ONNX backend has none).

A MatMul's weight ``W [K, N]`` is rounded one input row ``k`` at a time, in ``MatMulNBits``'s
blocks along ``K``; each row's rounding error is carried to the rows not yet rounded through
the upper Cholesky factor of the inverse Hessian ``(X^T X + damp I)^-1`` of the node's input
activations ``X [rows, K]`` (:func:`hessians`), so that ``X Q`` stays near ``X W``. Rows are
rounded in lazy batches of :data:`LAZY_ROWS`, a block's scale (and zero point when
asymmetric) computed when its first row is reached, from the weights as the rows before have
updated them (the paper's grouped form; no act-order: ``MatMulNBits`` reads ``g_idx`` in some
kernels only). Scales, zero points and rounding are ONNX Runtime's RTN's (MLAS's blockwise
quantizer): with an identity Hessian the codes are RTN's. numpy only, float64 throughout.

Example:
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((256, 64)) @ rng.standard_normal((64, 64))
    >>> w = rng.standard_normal((64, 8)).astype(np.float32)
    >>> codes = gptq_codes(w, inverse_factor(x.T @ x), bits=4, block_size=32, symmetric=True)
    >>> rtn = gptq_codes(w, inverse_factor(np.eye(64)), bits=4, block_size=32, symmetric=True)
    >>> error = lambda c: np.linalg.norm(x @ w - x @ c.dequantized())
    >>> bool(error(codes) < error(rtn))
    True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource

__all__ = [
    "LAZY_ROWS",
    "DAMPING",
    "BlockCodes",
    "InverseFactor",
    "inverse_factor",
    "gptq_codes",
    "hessians",
    "pack",
]

_logger = logging.getLogger(__name__)

#: Rows rounded between two updates of the rows after them (the paper's lazy batch).
LAZY_ROWS = 128
#: Dampening added to the Hessian's diagonal, as a share of its mean (the paper's 1 %).
DAMPING = 0.01


@dataclass(frozen=True)
class BlockCodes:
    """A weight's integer codes with their blocks' scales and zero points.

    Attributes:
        codes: ``[K, N]`` integers in ``0 .. 2**bits - 1``.
        scales: ``[N, blocks]`` float32, as ``MatMulNBits`` reads them.
        zero_points: ``[N, blocks]`` integers (the midpoint when symmetric).
        bits, block_size, symmetric: the choice they were rounded at.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    bits: int
    block_size: int
    symmetric: bool

    def dequantized(self) -> np.ndarray:
        """The ``[K, N]`` weights ``MatMulNBits`` computes with: ``(code - zero) * scale``."""
        rows = np.arange(self.codes.shape[0]) // self.block_size
        scale = self.scales.T[rows].astype(np.float64)
        zero = self.zero_points.T[rows].astype(np.float64)
        return (self.codes - zero) * scale


def _block_parameters(
    block: np.ndarray, bits: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point of each column of ``block`` [rows, N] as MLAS's
    blockwise quantizer computes them (``range2scale``/``range2scalezp``)."""
    values = block.astype(np.float32)
    low, high = values.min(axis=0), values.max(axis=0)
    top = float((1 << bits) - 1)
    mid = 1 << (bits - 1)
    if symmetric:
        # the value of largest magnitude maps to code 0 (-mid): the scale takes its sign
        extreme = np.where(np.abs(high) > np.abs(low), high, low)
        scale = (extreme / np.float32(-mid)).astype(np.float32)
        return scale, np.full(scale.shape, mid, np.int64)
    low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
    scale = ((high - low) / np.float32(top)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(scale != 0, np.float32(0) - low / scale, low).astype(np.float32)
    zero = np.where(zero < 0, 0, np.where(zero > top, top, _round_half_away(zero)))
    return scale, zero.astype(np.int64)


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves away from zero (numpy rounds them to even)."""
    return np.sign(values) * np.floor(np.abs(values) + 0.5)


def _round_row(
    row: np.ndarray, scale: np.ndarray, zero: np.ndarray, bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """One row's codes, in float32 as MLAS rounds them, and the values they stand for."""
    with np.errstate(divide="ignore"):
        reciprocal = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    scaled = row.astype(np.float32) * reciprocal + zero.astype(np.float32)
    codes = np.clip(_round_half_away(scaled), 0, (1 << bits) - 1).astype(np.int64)
    return codes, (codes - zero) * scale.astype(np.float64)


@dataclass(frozen=True)
class InverseFactor:
    """What GPTQ reads of a node's Hessian, the same for every choice of bits and block.

    Attributes:
        factor: the upper Cholesky factor ``U`` of the dampened ``H^-1`` (``H^-1 = U^T U``):
            row ``k`` carries row ``k``'s rounding error to the rows after it.
        dead: the inputs that were always zero (their weight rows are rounded as zeros).
    """

    factor: np.ndarray
    dead: np.ndarray


def inverse_factor(hessian: np.ndarray, damping: float = DAMPING) -> InverseFactor:
    """The :class:`InverseFactor` of ``hessian`` [K, K] (``X^T X``, any positive scale), its
    diagonal dampened by ``damping`` times its mean and its dead inputs set to one."""
    h = np.array(hessian, dtype=np.float64, copy=True)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices(len(h))] += damping * float(np.mean(np.diag(h)))
    lower = np.linalg.cholesky(h)
    lower_inverse = np.linalg.solve(lower, np.eye(len(h)))
    inverse = lower_inverse.T @ lower_inverse
    return InverseFactor(np.linalg.cholesky(inverse).T, dead)


def gptq_codes(
    weight: np.ndarray,
    inverse: InverseFactor,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
) -> BlockCodes:
    """``weight`` [K, N] rounded by GPTQ against its input's :func:`inverse_factor` (see the
    module).

    Args:
        weight: the float weight, input rows first.
        inverse: the node's input's :class:`InverseFactor`.
        bits: 4 or 8.
        block_size: rows per scale along ``K``.
        symmetric: no zero points (the midpoint ``MatMulNBits`` assumes without them).

    Returns:
        The codes with their scales and zero points.
    """
    rows, columns = weight.shape
    work = weight.astype(np.float64)  # a copy: the rows are updated as others are rounded
    work[inverse.dead, :] = 0.0
    factor = inverse.factor
    blocks = -(-rows // block_size)
    codes = np.zeros((rows, columns), np.int64)
    scales = np.zeros((columns, blocks), np.float32)
    zeros = np.zeros((columns, blocks), np.int64)
    lazy = max(LAZY_ROWS, block_size)  # a block never spans two lazy batches
    scale = zero = np.zeros(columns)
    for first in range(0, rows, lazy):
        last = min(first + lazy, rows)
        batch = work[first:last].copy()
        errors = np.zeros_like(batch)
        inner = factor[first:last, first:last]
        for i in range(last - first):
            row = first + i
            if row % block_size == 0:
                scale, zero = _block_parameters(batch[i : i + block_size], bits, symmetric)
                scales[:, row // block_size], zeros[:, row // block_size] = scale, zero
            codes[row], rounded = _round_row(batch[i], scale, zero, bits)
            error = (batch[i] - rounded) / inner[i, i]
            batch[i:] -= inner[i, i:, None] * error
            errors[i] = error
        work[last:] -= factor[first:last, last:].T @ errors
    return BlockCodes(codes, scales, zeros, bits, block_size, symmetric)


def pack(quantized: BlockCodes) -> tuple[np.ndarray, np.ndarray | None]:
    """``MatMulNBits``'s ``B`` ``[N, blocks, block_size * bits / 8]`` (uint8, a byte's low
    bits first, the padding of the last block zero) and its ``zero_points``
    ``[N, ceil(blocks * bits / 8)]`` (None when symmetric), as ONNX Runtime's RTN packs them."""
    codes, bits, block = quantized.codes, quantized.bits, quantized.block_size
    rows, columns = codes.shape
    blocks = -(-rows // block)
    padded = np.zeros((blocks * block, columns), np.uint8)
    padded[:rows] = codes
    per_block = padded.T.reshape(columns, blocks, block)
    packed = per_block if bits == 8 else per_block[..., 0::2] | (per_block[..., 1::2] << 4)
    if quantized.symmetric:
        return np.ascontiguousarray(packed, np.uint8), None
    zero = quantized.zero_points.astype(np.uint8)
    if bits == 4:
        if blocks % 2:  # the last byte's unused half at the midpoint, as ONNX Runtime writes
            zero = np.concatenate([zero, np.full((columns, 1), 8, np.uint8)], axis=1)
        zero = zero[:, 0::2] | (zero[:, 1::2] << 4)
    return np.ascontiguousarray(packed, np.uint8), np.ascontiguousarray(zero, np.uint8)


def hessians(
    model: onnx.ModelProto,
    external_folder: str | os.PathLike | None,
    inputs: Iterable[str],
    data: DataSource,
    *,
    threads: int | None,
    providers: Sequence[Any],
) -> dict[str, np.ndarray]:
    """``X^T X`` (float64) of each tensor of ``inputs`` over every feed of ``data``, the rows
    flattened over batch and sequence: ``model`` run once by ONNX Runtime with those tensors as
    outputs (its weights read from ``external_folder`` when external).

    Args:
        model: the float model (its header alone when its weights are external).
        external_folder: where its external data lies, or None.
        inputs: the weight MatMuls' activation inputs.
        data: the calibration data (complete feeds).
        threads: ONNX Runtime's intra-op threads.
        providers: ONNX Runtime's execution providers.

    Returns:
        Each input's Hessian, ``[K, K]``.
    """
    import onnx
    import onnxruntime as ort

    from raysearch.providers import session_options

    names = list(dict.fromkeys(inputs))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    options = session_options(threads)
    if external_folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", os.fspath(external_folder)
        )
    session = ort.InferenceSession(copy.SerializeToString(), options, providers=list(providers))
    del copy
    sums: dict[str, np.ndarray] = {}
    for feed in data.batches():
        for name, value in zip(names, session.run(names, feed), strict=True):
            x = np.asarray(value, dtype=np.float64)
            x = x.reshape(-1, x.shape[-1])
            if name in sums:
                sums[name] += x.T @ x
            else:
                sums[name] = x.T @ x
    return sums
