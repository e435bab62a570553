"""The PyTorch half of fast fine-tuning (imported only when it runs): :func:`fit_layer` learns a
layer's integer weights minimising ``|| f(W_q, X_q) - Y ||^2``.

AdaRound (Nagel et al. 2020): ``q = floor(W / s) + h(V) + zp`` with a rounding regulariser
(lambda 0.01, off for the first 20% of iterations, beta annealed 20 -> 2). AdaQuant (Hubara
et al. 2021): weight and bias learned with straight-through rounding. Both start from nearest
rounding; a layer keeps its weights when the result does not lower the error.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # importable without PyTorch (the package's modules are walked for doctests)
    torch = F = None  # type: ignore[assignment]

__all__ = ["LayerProblem", "FitResult", "fit_layer", "layer_output", "torch_threads"]

# AdaRound's rectified sigmoid stretch and its regulariser schedule (the paper's values).
_ZETA, _GAMMA = 1.1, -0.1
_REG_WEIGHT = 0.01
_BETA_START, _BETA_END = 20.0, 2.0
_WARMUP = 0.2
#: Relative error above which the torch forward is taken not to reproduce ONNX Runtime's
#: float output (an attribute it does not model): the layer is then left alone.
_FORWARD_TOLERANCE = 1e-3
_EVAL_CHUNK = 64


class LayerMismatch(ValueError):
    """The torch forward of a layer does not reproduce its float output."""


@dataclass
class LayerProblem:
    """One layer: op, attributes, float weight, quantization grid, integer weights and bias."""

    op_type: str
    attrs: Mapping[str, Any]
    weight: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    current: np.ndarray
    qmin: int
    qmax: int
    bias: np.ndarray | None = None
    bias_quantized: np.ndarray | None = None


@dataclass
class FitResult:
    """New integer weights, AdaQuant's bias, the MSE before and after, and whether changed."""

    weight: np.ndarray
    bias: np.ndarray | None
    mse_before: float
    mse_after: float
    changed: bool
    notes: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run torch on ``threads`` threads with deterministic cuDNN, then restore."""
    before = torch.get_num_threads()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.set_num_threads(max(1, int(threads)))
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def layer_output(
    op_type: str,
    attrs: Mapping[str, Any],
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The output of the ONNX node ``op_type`` with ``attrs`` on ``x``."""
    if op_type == "MatMul":
        return torch.matmul(x, weight)
    if op_type == "Gemm":
        a = x.transpose(0, 1) if attrs.get("transA", 0) else x
        b = weight.transpose(0, 1) if attrs.get("transB", 0) else weight
        out = float(attrs.get("alpha", 1.0)) * (a @ b)
        return out if bias is None else out + float(attrs.get("beta", 1.0)) * bias
    if op_type == "Conv":
        return _conv(attrs, x, weight, bias)
    raise LayerMismatch(f"unsupported op {op_type}")


def _conv(
    attrs: Mapping[str, Any], x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    dims = weight.dim() - 2
    if dims not in (1, 2, 3):
        raise LayerMismatch(f"Conv with {dims} spatial dimensions")
    strides = list(attrs.get("strides") or [1] * dims)
    dilations = list(attrs.get("dilations") or [1] * dims)
    kernel = list(weight.shape[2:])
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads_begin, pads_end = [], []
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations, strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            pads_begin.append(small if auto_pad == "SAME_UPPER" else large)
            pads_end.append(large if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID":
        pads_begin, pads_end = [0] * dims, [0] * dims
    else:
        pads = list(attrs.get("pads") or [0] * (2 * dims))
        pads_begin, pads_end = pads[:dims], pads[dims:]
    padding: Any = pads_begin
    if pads_begin != pads_end:  # asymmetric: pad explicitly (F.pad takes the last axis first)
        spec = [
            p for b, e in zip(reversed(pads_begin), reversed(pads_end), strict=True) for p in (b, e)
        ]
        x, padding = F.pad(x, spec), [0] * dims
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    return conv(x, weight, bias, strides, padding, dilations, int(attrs.get("group", 1)))


def fit_layer(
    problem: LayerProblem,
    x_quantized: np.ndarray,
    x_float: np.ndarray,
    target: np.ndarray,
    *,
    algorithm: str,
    iterations: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    device: str,
) -> FitResult:
    """Fit ``problem``'s integer weights on its inputs in the quantized model, in the float model,
    and its float outputs (LayerMismatch: the forward does not reproduce ``target``).
    """
    dev = torch.device(device)
    data = _LayerData(problem, x_quantized, x_float, target, dev)
    data.check_forward()
    scale = data.tensor(problem.scale)
    zp = data.tensor(problem.zero_point)
    bias_q = data.tensor(problem.bias_quantized) if problem.bias_quantized is not None else None
    current_w = scale * (data.tensor(problem.current) - zp)
    before = data.mse(current_w, bias_q)

    generator = torch.Generator().manual_seed(int(seed))
    if algorithm == "adaround":
        q, bias = _adaround(
            data, scale, zp, bias_q, iterations, learning_rate, batch_size, generator
        )
    elif algorithm == "adaquant":
        q, bias = _adaquant(
            data, scale, zp, bias_q, iterations, learning_rate, batch_size, generator
        )
    else:
        raise ValueError(f"unknown fine-tuning algorithm {algorithm!r}")
    after = data.mse(scale * (q - zp), bias if bias is not None else bias_q)
    if not after < before:  # never make a layer worse on the data it was fitted on
        return FitResult(problem.current.copy(), None, before, before, False)
    weight = q.detach().cpu().numpy().astype(np.int64)
    new_bias = None if bias is None else bias.detach().cpu().numpy().astype(np.float32)
    changed = not np.array_equal(weight, problem.current) or new_bias is not None
    return FitResult(weight, new_bias, before, after, changed)


class _LayerData:
    """The layer's captured tensors (kept on the CPU; batches move to the device)."""

    def __init__(
        self,
        problem: LayerProblem,
        x_quantized: np.ndarray,
        x_float: np.ndarray,
        target: np.ndarray,
        device: torch.device,
    ) -> None:
        self.problem = problem
        self.device = device
        self.xq = torch.from_numpy(np.ascontiguousarray(x_quantized, dtype=np.float32))
        self.xf = torch.from_numpy(np.ascontiguousarray(x_float, dtype=np.float32))
        self.target = torch.from_numpy(np.ascontiguousarray(target, dtype=np.float32))
        self.samples = int(self.xq.shape[0])
        self.axis = 1 if problem.op_type == "Conv" else -1

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array, dtype=np.float32), device=self.device)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        return layer_output(self.problem.op_type, self.problem.attrs, x, weight, bias)

    def check_forward(self) -> None:
        p = self.problem
        weight = self.tensor(p.weight)
        bias = self.tensor(p.bias) if p.bias is not None else None
        n = min(self.samples, 2)
        with torch.no_grad():
            out = self.forward(self.xf[:n].to(self.device), weight, bias).cpu()
        reference = self.target[:n]
        if out.shape != reference.shape:
            raise LayerMismatch(f"output shape {tuple(out.shape)} != {tuple(reference.shape)}")
        error = float(torch.linalg.vector_norm(out - reference))
        size = float(torch.linalg.vector_norm(reference))
        if error > _FORWARD_TOLERANCE * max(size, 1e-12):
            raise LayerMismatch(f"torch forward differs from ONNX Runtime by {error / size:.2e}")

    def batch(self, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, self.samples, (min(size, self.samples),), generator=generator)
        return self.xq[index].to(self.device), self.target[index].to(self.device)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Squared error summed over the output channels, averaged over the rest."""
        return (out - target).pow(2).sum(self.axis).mean()

    def mse(self, weight: torch.Tensor, bias: torch.Tensor | None) -> float:
        """Mean squared error of the layer's output with ``weight`` over every sample."""
        total, count = 0.0, 0
        with torch.no_grad():
            for start in range(0, self.samples, _EVAL_CHUNK):
                x = self.xq[start : start + _EVAL_CHUNK].to(self.device)
                target = self.target[start : start + _EVAL_CHUNK].to(self.device)
                diff = self.forward(x, weight, bias) - target
                total += float(diff.double().pow(2).sum())
                count += diff.numel()
        return total / max(count, 1)


def _soft(v: torch.Tensor) -> torch.Tensor:
    """AdaRound's rectified sigmoid h(V) in [0, 1]."""
    return torch.clamp(torch.sigmoid(v) * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)


def _adaround(
    data: _LayerData,
    scale: torch.Tensor,
    zp: torch.Tensor,
    bias_q: torch.Tensor | None,
    iterations: int,
    learning_rate: float,
    batch_size: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, None]:
    p = data.problem
    w_over_s = data.tensor(p.weight) / scale
    floor = torch.floor(w_over_s)
    rest = (w_over_s - floor).clamp(0.0, 1.0 - 1e-6)
    # V starts where h(V) equals the fractional part: rounding h >= 0.5 is then nearest.
    v = (-torch.log((_ZETA - _GAMMA) / (rest - _GAMMA) - 1.0)).requires_grad_(True)
    optimizer = torch.optim.Adam([v], lr=learning_rate)
    warmup = int(_WARMUP * iterations)
    for step in range(iterations):
        x, target = data.batch(generator, batch_size)
        h = _soft(v)
        weight = scale * (torch.clamp(floor + h + zp, p.qmin, p.qmax) - zp)
        loss = data.loss(data.forward(x, weight, bias_q), target)
        if step >= warmup:
            progress = (step - warmup) / max(1, iterations - warmup)
            beta = _BETA_START - (_BETA_START - _BETA_END) * progress
            loss = loss + _REG_WEIGHT * (1.0 - (2.0 * h - 1.0).abs().pow(beta)).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        q = torch.clamp(floor + (_soft(v) >= 0.5).float() + zp, p.qmin, p.qmax)
    return q, None


def _adaquant(
    data: _LayerData,
    scale: torch.Tensor,
    zp: torch.Tensor,
    bias_q: torch.Tensor | None,
    iterations: int,
    learning_rate: float,
    batch_size: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    p = data.problem
    weight = data.tensor(p.weight).clone().requires_grad_(True)
    params = [weight]
    bias = None
    if bias_q is not None:
        start = p.bias if p.bias is not None else p.bias_quantized
        bias = data.tensor(start).clone().requires_grad_(True)
        params.append(bias)
    optimizer = torch.optim.Adam(params, lr=learning_rate)

    def quantized(w: torch.Tensor) -> torch.Tensor:
        scaled = w / scale
        rounded = scaled + (torch.round(scaled) - scaled).detach()  # straight-through
        return scale * (torch.clamp(rounded + zp, p.qmin, p.qmax) - zp)

    for _ in range(iterations):
        x, target = data.batch(generator, batch_size)
        loss = data.loss(data.forward(x, quantized(weight), bias), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        q = torch.clamp(torch.round(weight / scale) + zp, p.qmin, p.qmax)
    return q, None if bias is None else bias.detach()
