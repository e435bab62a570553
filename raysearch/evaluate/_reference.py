"""The float reference: the float model's outputs on the evaluation data, once per search.

Built-in metrics compare every quantized model with these outputs; they are cached on disk
under a key of the model, the data, its batching and the device kind."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysearch.errors import EvaluatorError
from raysearch.evaluate._run import run_model
from raysearch.fileio import building_folder
from raysearch.modelfile import file_hash

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["FloatReference"]

# The logger of the public module, the name users filter on.
_logger = logging.getLogger("raysearch.evaluate")


@dataclass
class FloatReference:
    """The float model's outputs on the evaluation data, computed once per search; saved as one
    ``.npy`` per output (memory-mapped when loaded) and ``meta.json``.
    """

    outputs: dict[str, np.ndarray]
    key: str = ""
    device: str = "cpu"
    latency_ms: float | None = None

    @staticmethod
    def cache_key(model_hash: str, data: DataSource, device: str = "cpu") -> str:
        """The key of a reference: model, data, batching and device kind."""
        text = f"{model_hash}|{data.content_hash}|{data.batch_size}|{data.sample_is_feed}|"
        text += device.split(":")[0]
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @classmethod
    def compute(
        cls,
        model_path: str | os.PathLike,
        data: DataSource,
        *,
        threads: int = 1,
        gpu_id: int | None = None,
        model_hash: str | None = None,
        providers: Sequence[Any] | None = None,
    ) -> FloatReference:
        """Run the float model once over ``data`` (EvaluatorError: its outputs hold NaN or inf)."""
        from raysearch.providers import make_session

        device = _device(gpu_id, providers)
        session = make_session(model_path, threads, gpu_id, providers=providers)
        try:
            outputs, latencies = run_model(session, data)
        finally:
            del session
        for name, value in outputs.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise EvaluatorError(
                    f"the float model's output '{name}' holds NaN or inf on the evaluation data"
                )
        key = cls.cache_key(model_hash or file_hash(model_path), data, device)
        latency = float(np.median(latencies[1:] or latencies)) if latencies else None
        return cls(outputs, key=key, device=device, latency_ms=latency)

    @classmethod
    def cached(
        cls,
        cache_dir: str | os.PathLike | None,
        model_path: str | os.PathLike,
        data: DataSource,
        *,
        threads: int = 1,
        gpu_id: int | None = None,
        providers: Sequence[Any] | None = None,
    ) -> FloatReference:
        """Load the reference from ``cache_dir/reference/<key>`` or compute and save it."""

        model_hash = file_hash(model_path)
        options = {"threads": threads, "gpu_id": gpu_id, "providers": providers}
        if cache_dir is None:
            return cls.compute(model_path, data, model_hash=model_hash, **options)
        device = _device(gpu_id, providers)
        folder = Path(cache_dir) / "reference" / cls.cache_key(model_hash, data, device)
        if (folder / "meta.json").is_file():
            try:
                return cls.load(folder)
            except (OSError, ValueError, KeyError) as exc:
                _logger.warning("recomputing the float reference (%s unreadable: %s)", folder, exc)
        reference = cls.compute(model_path, data, model_hash=model_hash, **options)
        reference.keep(cache_dir)
        return reference

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``meta.json`` and ``output_<i>.npy`` into ``folder`` atomically (first
        one stays).
        """
        folder = Path(folder)
        with building_folder(folder, lambda f: (f / "meta.json").is_file()) as tmp:
            files = []
            for i, (name, value) in enumerate(self.outputs.items()):
                file = f"output_{i}.npy"
                np.save(tmp / file, np.ascontiguousarray(value), allow_pickle=False)
                files.append({"name": name, "file": file})
            meta = {
                "version": 1,
                "key": self.key,
                "device": self.device,
                "latency_ms": self.latency_ms,
                "outputs": files,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        return folder

    def keep(self, cache_dir: str | os.PathLike) -> None:
        """Save the reference as ``cache_dir/reference/<key>`` (what a resumed search reads)
        unless it is there; a failed write is logged (the search goes on without it)."""
        folder = Path(cache_dir) / "reference" / self.key
        if (folder / "meta.json").is_file():
            return
        try:
            self.save(folder)
        except OSError as exc:
            _logger.warning("could not save the float reference: %s", exc)

    @classmethod
    def load(cls, folder: str | os.PathLike, mmap: bool = True) -> FloatReference:
        """Read a reference written by :meth:`save` (memory-mapped unless ``mmap`` is False)."""
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        outputs = {
            entry["name"]: np.load(
                folder / entry["file"], mmap_mode="r" if mmap else None, allow_pickle=False
            )
            for entry in meta["outputs"]
        }
        return cls(
            outputs,
            key=meta.get("key", ""),
            device=meta.get("device", "cpu"),
            latency_ms=meta.get("latency_ms"),
        )


def _device(gpu_id: int | None, providers: Sequence[Any] | None) -> str:
    """The device label of sessions made with ``providers``, else with ``gpu_id``'s."""
    from raysearch.providers import device_label, execution_providers

    return device_label(providers) if providers else execution_providers(gpu_id)[2]
