"""The trial engine's factory (:class:`EngineSpec`), built once on the driver from what
:func:`~raysearch.search.preflight.preflight` computed, and shipped to every actor."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.errors import InputError
from raysearch.search.runtime.transfer import (
    ModelBlob,
    current_node_id,
    materialize_model,
    node_folder_here,
)
from raysearch.search.tune._rungs import plan_search_rungs
from raysearch.usercode import import_plugins, plugin_modules, where_code_lives

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.evaluate.subsets import EvalRungs
    from raysearch.search._pending_reference import PendingReference
    from raysearch.search.preflight import Prepared

__all__ = ["EngineSpec", "build_engine"]

_logger = logging.getLogger("raysearch.search")


@dataclass
class EngineSpec:
    """Builds a :class:`~raysearch.trial.TrialRunner` inside an actor."""

    model: ModelBlob
    calibration: Any
    evaluation: Any
    evaluator: Any
    cache_dir: str
    reference: Any = None
    float_score: float | None = None
    measure_latency: bool = True
    #: Where the trials take a float reference still being computed, when ``reference`` is None.
    reference_source: Any = None
    driver_node: str | None = None
    gpu_fraction: float = 0.0
    #: The rungs a trial's evaluation runs through (None: every row at once).
    rungs: EvalRungs | None = None
    #: Modules that registered a plugin in the driver: the actor imports them first.
    plugins: tuple[str, ...] = field(default_factory=plugin_modules)
    #: The config's search folders, where a plugin module found beside it lives.
    code_dirs: tuple[str, ...] = ()
    #: The slowest decode step, in ms, a candidate may take (``max_decode_latency``).
    max_decode_latency_ms: float | None = None
    #: The model whose decode step a candidate's may not exceed, timed in turn with it.
    decode_anchor: ModelBlob | None = None
    #: The largest model, in bytes, a candidate may be (``size_budget``).
    max_model_size_bytes: int | None = None

    def __call__(self, *, threads: int = 1, gpu_id: int | None = None) -> Any:
        from raysearch.providers import gpu_memory_limit
        from raysearch.trial import FloatBaseline, TrialDevice, TrialRunner, TrialSpec

        import_plugins(self.plugins, strict=False, search_dirs=where_code_lives(self.code_dirs))

        model_path, cache_dir = self.model.path, self.cache_dir
        anchor = self.decode_anchor.path if self.decode_anchor is not None else None
        if self.driver_node is not None and current_node_id() != self.driver_node:
            # Another node: the model from the object store, the calibration cache on this node.
            model_path = materialize_model(self.model)
            cache_dir = os.fspath(node_folder_here("cache", self.cache_dir))
            if self.decode_anchor is not None:
                anchor = materialize_model(self.decode_anchor)
        return TrialRunner(
            TrialSpec(
                model_path,
                self.calibration,
                self.evaluation,
                self.evaluator,
                cache_dir=cache_dir,
                device=TrialDevice(
                    threads=threads,
                    gpu_id=gpu_id,
                    gpu_mem_limit=gpu_memory_limit(gpu_id, self.gpu_fraction),
                ),
                baseline=FloatBaseline(
                    reference=self.reference,
                    score=self.float_score,
                    reference_source=self.reference_source,
                ),
                measure_latency=self.measure_latency,
                rungs=self.rungs,
                max_decode_latency_ms=self.max_decode_latency_ms,
                decode_anchor_path=anchor,
                max_model_size_bytes=self.max_model_size_bytes,
            )
        )


def build_engine(
    config: SearchConfig, cache_dir: str, prepared: Prepared
) -> tuple[EngineSpec, dict[str, Any]]:
    """The trial engine's factory from what :func:`preflight` computed (its float reference
    saved in the search's cache), with the rungs of its evaluation (``info["early_stopping"]``)."""
    if prepared.reference is not None:
        prepared.reference.keep(cache_dir)
    reference, float_score = prepared.reference, prepared.float_score
    info = dict(prepared.info)
    float_s = info.pop("float_s", 0.0)
    pending = prepared.pending_reference
    if pending is None:
        _logger.info(
            "float reference ready in %.2f s (%s)",
            float_s,
            "outputs" if reference is not None else f"score {float_score}",
        )
    spec = EngineSpec(
        ModelBlob(str(config.model)),  # shipped once Ray runs
        prepared.calibration,
        prepared.evaluation,
        prepared.evaluator,
        cache_dir,
        reference,
        float_score,
        config.measure_latency,
        gpu_fraction=config.resources.gpu_per_trial,
    )
    spec.rungs, info["early_stopping"] = plan_search_rungs(config, prepared)
    # A decode step is timed on a trial's CPU threads; a trial on a GPU is held to no CPU figure.
    cpu, threads = config.resources.gpu_per_trial == 0, max(1, int(config.resources.cpu_per_trial))
    bound = config.max_decode_latency
    builder = None
    if config.size_budget == "builder" or (bound == "builder" and cpu):
        from raysearch.search.preflight import builder_int4

        builder = builder_int4(config.model, prepared.evaluation, Path(cache_dir) / "builder")
    if bound == "builder" and cpu and builder is not None:
        from raysearch.search.preflight import float_decoder_latency

        timed = float_decoder_latency(builder, prepared.evaluation, threads)
        if "decode_latency_ms" not in timed:
            raise InputError(
                "max_decode_latency: builder: the decode step of the builder's int4 could not "
                "be timed (--log-level DEBUG says why); give milliseconds instead"
            )
        info["builder_decode_latency_ms"] = timed["decode_latency_ms"]
        spec.decode_anchor = ModelBlob(str(builder))
    if bound in ("float", "builder"):
        bound = info.get(f"{bound}_decode_latency_ms") if cpu else None
    spec.max_decode_latency_ms = bound
    spec.max_model_size_bytes = size_budget_bytes(config, builder)
    spec.code_dirs = tuple(os.fspath(folder) for folder in config.code_dirs)
    if pending is not None:
        spec.reference_source = _hold_pending(pending, cache_dir)
        if spec.reference_source is None:
            spec.reference = pending.future.result()
            info["float_latency_ms"] = spec.reference.latency_ms
            spec.reference.keep(cache_dir)
            prepared.pending_reference = None
    return spec, info


def _hold_pending(pending: PendingReference, cache_dir: str) -> Any:
    """The trials' source of a float reference still being computed: the search's cache, which
    the driver fills when it is ready; None when a trial may run on another node."""
    from raysearch.search.runtime._reference_handoff import HANDOFF, WaitedReference, hand_over
    from raysearch.search.runtime.cluster import only_driver_node

    if not only_driver_node():
        return None
    folder = Path(cache_dir) / "reference"
    (folder / HANDOFF).unlink(missing_ok=True)  # an earlier search's, in a reused cache

    def done(future: Any) -> None:
        if future.exception() is None:
            _logger.info(
                "float reference ready in %.2f s (outputs; the first trials started before)",
                pending.took_s or 0.0,
            )
        try:
            hand_over(folder, future)
        except OSError as exc:  # the trials would wait for it: the search ends (_execute)
            pending.hand_over_error = exc
            _logger.error("could not hand the float reference to the trials: %s", exc)

    _logger.info("float model checked on the first evaluation batch; the rest runs meanwhile")
    pending.future.add_done_callback(done)
    return WaitedReference(str(folder))


def size_budget_bytes(config: SearchConfig, builder: str | os.PathLike | None = None) -> int | None:
    """The config's ``size_budget`` in bytes (megabytes, or the size of ``builder``'s int4)."""
    value = config.size_budget
    if value is None:
        return None
    if value != "builder":
        return int(float(value) * 1e6)
    from raysearch.modelfile import model_size_bytes

    if builder is None:
        raise ValueError("size_budget: builder needs the builder's int4 written")
    return model_size_bytes(builder)
