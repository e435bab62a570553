"""Everything a search needs checked before Ray starts and before its output folder exists:
:func:`preflight` checks the model (with its external data, and something the spaces would
quantize), the data against the model's inputs, and the evaluator (the float reference, or a
custom evaluator's float score), writing nothing; any problem is a one-line
:class:`~raysearch.errors.InputError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.errors import ConfigError, InputError
from raysearch.search._pending_reference import PendingReference, deferrable, first_batch
from raysearch.strategies import ModelFacts

if TYPE_CHECKING:
    import onnx

    from raysearch.config import SearchConfig
    from raysearch.data import DataSource
    from raysearch.evaluate import Evaluator, FloatReference
    from raysearch.space import SearchSpace

__all__ = [
    "Prepared",
    "preflight",
    "start_preflight",
    "check_model",
    "builder_int4",
    "stderr_lines",
    "STDERR_LOGGER",
    "warn_if_u8s8_saturates",
]

_logger = logging.getLogger(__name__)

#: The logger (at INFO: ``auto_search.log``) of :attr:`Prepared.stderr_lines`.
STDERR_LOGGER = "raysearch.stderr"


@dataclass
class Prepared:
    """What :func:`preflight` checked and computed, handed to the search."""

    calibration: DataSource
    evaluation: DataSource
    evaluator: Evaluator
    reference: FloatReference | None = None
    float_score: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: Node and tensor names and op types of the float model, for the search strategy.
    model: ModelFacts = field(default_factory=ModelFacts)
    #: The float reference still being computed (its first batch is ``probe``).
    pending_reference: PendingReference | None = None
    probe: FloatReference | None = None
    #: What a custom evaluator's float run wrote to standard error, for the log only.
    stderr_lines: list[str] = field(default_factory=list)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_model(path: str | os.PathLike, spaces: Iterable[SearchSpace] = ()) -> onnx.ModelProto:
    """Load ``path`` as ONNX (external data checked, not loaded) and check that ``spaces``
    would quantize something in it; returns the model without its external data.

    Raises:
        ConfigError: (key ``model``, or the setting's key) the file is not a usable ONNX model,
            an external-data file is missing or short, or no setting would quantize any op.
    """
    from raysearch.modelfile import load_header

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError("model", f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise ConfigError("model", f"{path} is empty")
    try:
        proto = load_header(path)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ConfigError(
            "model", f"{path} is not an ONNX model (cannot parse it: {_first_line(exc)})"
        ) from None
    if not proto.HasField("graph") or not proto.graph.node:
        raise ConfigError("model", f"{path} is not an ONNX model with a graph (no nodes found)")
    _check_external_data(proto, path)
    _check_quantizable(proto, path, list(spaces))
    return proto


def _check_external_data(proto: onnx.ModelProto, path: Path) -> None:
    import onnx

    from raysearch.modelfile import graph_tensors

    for tensor in graph_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = (path.parent / location).resolve()
        # By name: a data file that is a link to elsewhere is fine.
        lexical = Path(os.path.normpath(path.parent.absolute() / location))
        if location and not lexical.is_relative_to(path.parent.absolute()):
            raise ConfigError(
                "model",
                f"external data file '{location}' of tensor '{tensor.name}' is outside the "
                f"model's folder {path.parent} (ONNX Runtime reads external data only there)",
            )
        if not location or not target.is_file():
            raise ConfigError(
                "model",
                f"external data file '{location}' of tensor '{tensor.name}' not found "
                f"(looked for {target})",
            )
        end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        if end > target.stat().st_size:
            raise ConfigError(
                "model",
                f"external data file '{location}' is truncated: tensor '{tensor.name}' needs "
                f"{end} bytes, the file has {target.stat().st_size}",
            )


def _choices(space: SearchSpace, leaf: str) -> list[Any]:
    """Every value ``space`` may give the setting ``leaf`` ([None] when it never sets it)."""
    from raysearch.space import Categorical

    values: list[Any] = []
    for param in space.params:
        if param.leaf == leaf and isinstance(param.domain, Categorical):
            values.extend(param.domain.choices)
    return values or [None]


def _backend_names(space: SearchSpace) -> list[str]:
    """The quantizer backends ``space`` can select (the default one when it names none)."""
    from raysearch.quantize.registry import DEFAULT_BACKEND

    return [name or DEFAULT_BACKEND for name in _choices(space, "quantizer")]


def _check_quantizable(proto: onnx.ModelProto, path: Path, spaces: list[SearchSpace]) -> None:
    """Each backend a space can select checks every choice of its ``model_settings`` (op
    types, node names) against the model."""
    from raysearch.quantize.registry import get_backend

    for space in spaces:
        for backend_name in _backend_names(space):
            backend = get_backend(backend_name)
            for key in backend.model_settings:
                *containers, leaf = key.split(".")
                for value in _choices(space, leaf):  # None: the backend's default
                    setting: dict[str, Any] = {leaf: value}
                    for container in reversed(containers):
                        setting = {container: setting}
                    backend.validate(setting, os.fspath(path))


_EIGHT_BIT = {None, "QInt8", "QUInt8"}  # None: ONNX Runtime's default, QInt8


def may_saturate(space: SearchSpace) -> bool:
    """Whether ``space`` can select an ONNX Runtime setting with 8-bit activations, int8
    weights and 8-bit weight range, which saturates on CPUs without VNNI (raysearch.cpu)."""
    if "ort" not in _backend_names(space):
        return False
    activations = set(_choices(space, "activation_type"))
    weights = set(_choices(space, "weight_type"))
    reduce_range = set(_choices(space, "reduce_range"))
    return (
        bool(activations & _EIGHT_BIT)
        and bool(weights & {None, "QInt8"})
        and bool(reduce_range & {None, False})
    )


def warn_if_u8s8_saturates(spaces: Iterable[SearchSpace]) -> bool:
    """Say in one log line when this CPU adds uint8 x int8 products in saturating int16 sums
    and a space can select such a setting (nothing is changed: the choice is the user's).
    Returns whether it warned."""
    from raysearch.cpu import u8s8_saturates

    if not u8s8_saturates() or not any(may_saturate(space) for space in spaces):
        return False
    _logger.warning(
        "this CPU has no VNNI: ONNX Runtime's int8 kernels add uint8 x int8 products in int16 "
        "and can saturate, so an int8 model may score lower here than on a CPU with VNNI; "
        "searching reduce_range: [false, true] or weight_type: QUInt8 (ONNX Runtime's advice) "
        "shows whether it costs accuracy"
    )
    return True


def preflight(
    config: SearchConfig,
    *,
    cache_dir: str | os.PathLike | None = None,
    kept: Callable[[str, DataSource], FloatReference | None] | None = None,
    defer_reference: bool = False,
    check_only: bool = False,
) -> Prepared:
    """Check the model, data and evaluator of ``config`` and compute the float reference or
    the float model's score, writing nothing but ``cache_dir``'s reference. ``kept(model,
    data)`` is asked first (a running cluster's reference of an earlier search). With
    ``defer_reference`` (no cache, nothing kept), only the first evaluation batch runs here
    and the rest in a thread (:attr:`Prepared.pending_reference`); with ``check_only``
    (``raysearch validate``) the first batch alone (:attr:`Prepared.probe`).

    Raises:
        InputError: a one-line message naming what is wrong.
    """
    from raysearch.data import DataSource, model_inputs
    from raysearch.evaluate import Evaluator
    from raysearch.modelfile import model_size_bytes

    model = os.fspath(config.model)
    proto = check_model(model, config.search_spaces)
    inputs = model_inputs(proto, path=model)
    calibration = DataSource.load(
        config.calibration_data, inputs, config.batch_size, label="calibration data"
    )
    if config.eval_data is config.calibration_data:
        evaluation = calibration
    else:
        evaluation = DataSource.load(
            config.eval_data, inputs, config.batch_size, label="evaluation data"
        )
    evaluator = Evaluator.from_config(config)
    prepared = Prepared(calibration, evaluation, evaluator, model=ModelFacts.of(proto))
    prepared.info["float_model_size_bytes"] = model_size_bytes(model)
    threads = max(1, min(os.cpu_count() or 1, 4))
    trial_threads = max(1, int(config.resources.cpu_per_trial))
    started = time.perf_counter()
    if not check_only and evaluator.is_lm and config.measure_latency:
        # Before the reference's session opens: one float session at a time.
        for name, value in float_decoder_latency(model, evaluation, trial_threads).items():
            prepared.info[f"float_{name}"] = value
    reference = kept(model, evaluation) if kept and evaluator.needs_reference else None
    if reference is not None:
        prepared.reference = reference
        prepared.info["float_latency_ms"] = reference.latency_ms
    elif evaluator.needs_reference:
        later = defer_reference and cache_dir is None and deferrable(evaluation)
        _reference(
            prepared, model, cache_dir, threads, later=later or check_only, rest=not check_only
        )
    else:
        with stderr_lines() as lines:
            prepared.float_score = evaluator.score_float(model)
        prepared.stderr_lines = lines
        prepared.info["float_metric"] = prepared.float_score
        prepared.info["float_score_s"] = time.perf_counter() - started
        if not check_only:
            # The evaluator's run is not timed (its own code): one batch, as a trial times one.
            from raysearch.evaluate import measure_latency

            batch = evaluation.batch(0)
            latency = _float_latency(model, trial_threads, None, measure_latency, batch)
            prepared.info["float_latency_ms"] = latency
    prepared.info["float_s"] = time.perf_counter() - started
    return prepared


def _reference(
    prepared: Prepared,
    model: str,
    cache_dir: str | os.PathLike | None,
    threads: int,
    *,
    later: bool,
    rest: bool = True,
) -> None:
    """The float reference of ``prepared``'s evaluation data, or, ``later``, its first batch
    and, with ``rest``, the rest in a thread (:attr:`Prepared.pending_reference`)."""
    from raysearch.evaluate import FloatReference

    evaluation = prepared.evaluation
    try:
        if later:
            prepared.probe = FloatReference.compute(model, first_batch(evaluation), threads=threads)
        elif cache_dir is None:
            prepared.reference = FloatReference.compute(model, evaluation, threads=threads)
        else:
            prepared.reference = FloatReference.cached(
                cache_dir, model, evaluation, threads=threads
            )
    except InputError:
        raise
    except Exception as exc:  # ONNX Runtime refuses the model or the data
        raise _cannot_run(exc) from None
    if later and rest:
        prepared.pending_reference = PendingReference(
            model, evaluation, threads=threads, to_error=_cannot_run
        )
    elif not later:
        prepared.info["float_latency_ms"] = prepared.reference.latency_ms


def _cannot_run(exc: Exception) -> ConfigError:
    """The one-line error of ONNX Runtime refusing the float model or the evaluation data."""
    return ConfigError(
        "model",
        f"ONNX Runtime cannot run the float model on the evaluation data: {_first_line(exc, 300)}",
    )


def _float_latency(model: str, threads: int, default: Any, measure: Callable, data: Any) -> Any:
    """``measure(session, data)`` of the float model on the CPU, as a trial times its model;
    ``default`` (and a DEBUG line) when ONNX Runtime cannot: latency is secondary."""
    from raysearch.providers import make_session

    try:
        return measure(make_session(model, threads), data)
    except Exception as exc:  # noqa: BLE001 - never fail a search for the float latency
        _logger.debug("the float model's latency could not be measured: %s", exc)
        return default


def float_decoder_latency(model: str | os.PathLike, data: DataSource, threads: int) -> dict:
    """The float model's decode step and prefill latency (empty when ONNX Runtime cannot)."""
    from raysearch.evaluate import measure_decoder_latency

    return _float_latency(os.fspath(model), threads, {}, measure_decoder_latency, data)


def builder_int4(model: str | os.PathLike, data: DataSource, folder: str | os.PathLike) -> Path:
    """onnxruntime-genai's builder's int4 of ``model`` (what ``size_budget: builder`` and
    ``max_decode_latency: builder`` hold a candidate to) as ``folder/model.onnx``, kept when
    there already (a resumed search's).

    Raises:
        InputError: the model cannot be quantized so.
    """
    from raysearch.quantize.registry import get_backend
    from raysearch.strategies import BUILDER_SETTINGS

    out = Path(folder) / "model.onnx"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        backend = get_backend(BUILDER_SETTINGS["quantizer"])
        with backend(model, data) as quantizer, stderr_lines():
            quantizer.quantize(BUILDER_SETTINGS, out)
    except Exception as exc:  # noqa: BLE001 - said in one line
        raise InputError(
            f"the builder's int4 of the model (size_budget or max_decode_latency: builder) could "
            f"not be written: {type(exc).__name__}: {exc}"
        ) from exc
    return out


@contextlib.contextmanager
def stderr_lines() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 (ONNX Runtime's C++ logger) within the
    block as the lines of the list it yields; written to standard error if the block raises.

    Example:
        >>> with stderr_lines() as lines:
        ...     _ = os.write(2, b"W onnxruntime: Removing initializer 'x'\\n")
        >>> lines
        ["W onnxruntime: Removing initializer 'x'"]
    """
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no standard error to take: nothing to keep
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield lines
            failed = False
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()  # what Python buffered in the block goes to the sink too
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            lines.extend(line for line in text.splitlines() if line.strip())
            if failed and text:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    sys.stderr.write(text)


def start_preflight(
    config: SearchConfig,
    kept: Callable[[str, DataSource], FloatReference | None] | None = None,
) -> Future[Prepared] | None:
    """:func:`preflight` of ``config`` in a daemon thread, so that the float model runs while
    the command imports Ray Tune; None for a custom evaluator (its code may import anything:
    it runs later in the caller's thread). What :func:`preflight` imports is imported here
    first, so that the two threads never import the same module at once."""
    from raysearch.evaluate import Evaluator

    if not Evaluator.from_config(config).needs_reference:
        return None
    _import_what_preflight_uses(config)
    pending: Future[Prepared] = Future()

    def _run() -> None:
        if not pending.set_running_or_notify_cancel():
            return
        try:
            pending.set_result(preflight(config, kept=kept, defer_reference=kept is None))
        except BaseException as exc:  # handed to whoever waits for the result
            pending.set_exception(exc)

    threading.Thread(target=_run, name="raysearch-preflight", daemon=True).start()
    return pending


def _import_what_preflight_uses(config: SearchConfig) -> None:
    """Import the modules :func:`preflight` imports (a backend that fails is its to report)."""
    import raysearch.data  # noqa: F401
    import raysearch.evaluate  # noqa: F401  (the float model's run)
    import raysearch.modelfile  # noqa: F401
    import raysearch.providers  # noqa: F401
    from raysearch.quantize.registry import get_backend

    for space in config.search_spaces:
        for backend_name in _backend_names(space):
            try:
                get_backend(backend_name)
            except Exception:  # noqa: BLE001 - preflight reports it, in its order
                continue
