"""The ``"nncf"`` backend: OpenVINO NNCF's ``nncf.quantize`` on the ONNX model, a QDQ model out.

NNCF is imported only when a backend is built. The prepared float model (``Constant`` weights
as initializers, opset at least 13) and the ``nncf.Dataset`` are reused across a process's
trials; the statistics are collected again each trial (NNCF caches none on ONNX). Mixed
precision is refused; nodes a technique keeps float join ``ignored_scope.names``.

Example:
    >>> NncfBackend.reject({"model_type": "transformer", "fast_bias_correction": False})[:35]
    "NNCF 3.4's BiasCorrection (fast_bia"
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysearch.errors import ConfigError, suggest
from raysearch.modelfile import graph_nodes, load_header
from raysearch.quantize.backends.nncf.options import NNCF_CATALOGUE, missing_nncf, reject_reason
from raysearch.quantize.nncf_runtime import (
    NncfModelBackend,
    nncf_dataset,
    nncf_session,
)
from raysearch.quantize.registry import QuantizeInfo, register_backend

if TYPE_CHECKING:
    import onnx

    from raysearch.space.catalogue import Catalogue

__all__ = ["NncfBackend"]

_logger = logging.getLogger(__name__)


@register_backend("nncf")
class NncfBackend(NncfModelBackend):
    """NNCF's ``nncf.quantize`` with the trial's providers and threads (see the module)."""

    #: The settings this backend takes (``raysearch.quantize.backends.nncf.options``).
    catalogue: ClassVar[Catalogue | None] = NNCF_CATALOGUE
    #: Settings checked against the model before a search (:meth:`validate`).
    model_settings: ClassVar[tuple[str, ...]] = (
        "ignored_scope.types",
        "ignored_scope.names",
        "ignored_scope.patterns",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dataset = nncf_dataset(self.calibration)

    @classmethod
    def missing_requirement(cls) -> str | None:
        return missing_nncf()

    @classmethod
    def validate(
        cls, settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto
    ) -> None:
        """Refuse an ``ignored_scope`` that matches nothing in ``model`` (NNCF would refuse it)."""
        scope = settings.get("ignored_scope") or {}
        if not any(scope.get(k) for k in ("types", "names", "patterns")):
            return
        proto = model if not isinstance(model, (str, os.PathLike)) else load_header(model)
        nodes = list(graph_nodes(proto.graph))
        _check_present("ignored_scope.types", scope.get("types"), {n.op_type for n in nodes})
        _check_present("ignored_scope.names", scope.get("names"), {n.name for n in nodes})
        for pattern in scope.get("patterns") or []:
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    "ignored_scope.patterns", f"'{pattern}' is no regular expression: {exc}"
                ) from None
            if not any(regex.match(n.name) for n in nodes if n.name):
                raise ConfigError(
                    "ignored_scope.patterns", f"'{pattern}' matches no node name of the model"
                )

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        return reject_reason(settings)

    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        """Quantize with ``settings`` into ``out_path``; NNCF's errors as one line naming NNCF."""
        from raysearch.quantize.backends.nncf._params import quantize_arguments

        reason = reject_reason(settings)
        if reason:
            raise ValueError(reason)
        items = self._dataset.get_length()
        arguments = quantize_arguments(self._nncf, settings, items, self._data_dir)
        start = time.perf_counter()
        with nncf_session(self.providers, self.threads) as engine:
            try:
                quantized = self._nncf.quantize(self._model, self._dataset, **arguments)
            except Exception as exc:  # NNCF's own failures: one line, the search goes on
                raise ValueError(_failure_line(exc)) from exc
        self._save(quantized, out_path)
        total = time.perf_counter() - start
        return QuantizeInfo(
            calibration_s=engine.total_s,
            quantization_s=total - engine.total_s,
            calib_cache_hit=False,
            extra={
                "nncf_sessions": float(engine.sessions),
                "nncf_session_s": engine.session_s,
                "nncf_inferences": float(engine.inferences),
                "nncf_inference_s": engine.inference_s,
            },
        )


def _check_present(key: str, requested: Sequence[str] | None, in_model: set[str]) -> None:
    missing = [v for v in requested or [] if v not in in_model]
    if missing:
        pool = sorted(v for v in in_model if v)
        described = ", ".join(f"'{v}'{suggest(v, pool)}" for v in missing)
        raise ConfigError(key, f"not in the model: {described}")


def _failure_line(exc: BaseException) -> str:
    """``NNCF <version> failed in <step> (<type>): <first line>``, ONNX Runtime's prefix dropped."""
    from nncf import __version__

    step = ""
    tb = exc.__traceback__
    while tb is not None:
        found = re.search(
            r"nncf[/\\]quantization[/\\]algorithms[/\\](\w+)", tb.tb_frame.f_code.co_filename
        )
        step = found.group(1) if found else step
        tb = tb.tb_next
    text = str(exc).strip().splitlines()
    message = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text[0] if text else "")
    where = f" in {step}" if step else ""
    return f"NNCF {__version__} failed{where} ({type(exc).__name__}): {message}".rstrip(": ")
