"""Sensitivity probes kept across searches, by content (model, settings, data, metric, versions
of raysearch, ONNX Runtime and ONNX): :class:`ProbeCache`. A later search journals a kept
result with ``reused_from`` and runs no trial (candidacy decided again). Entries are JSON files
in this user's private ``raysearch-probes/``, named by the hash of their key and of their own
bytes; ``RAYSEARCH_PROBE_CACHE=0`` keeps and reuses nothing.

Example:
    >>> import tempfile
    >>> cache = ProbeCache(lambda: {"model": "m1"}, tempfile.mkdtemp(), origin="out")
    >>> probe = {"bits": 4, "nodes_4bit": ["a"], "nodes_float": ["b"]}
    >>> cache.store(probe, TrialRecord(status="ok", metric=0.25), "t1")
    True
    >>> cache.lookup(probe).reused_from, cache.lookup({"bits": 8}) is None
    ('out trial t1', True)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raysearch.fileio import atomic_write_bytes
from raysearch.ranking import finite
from raysearch.space import settings_key
from raysearch.trialrecord import TrialRecord

__all__ = ["ProbeCache", "FOLDER", "enabled", "content_key", "search_probe_cache"]

_logger = logging.getLogger(__name__)

#: The cache's folder in this user's private temporary folder.
FOLDER = "raysearch-probes"
#: ``0`` (or ``off``, ``false``) turns the cache off: nothing kept, nothing reused.
ENVIRONMENT = "RAYSEARCH_PROBE_CACHE"
#: Part of every key: what an entry holds and how it is read.
_FORMAT = 1
#: What an entry keeps of a probe's record: what it measured.
_KEPT = (
    "metric",
    "extra",
    "model_size_bytes",
    "latency_ms",
    "decode_latency_ms",
    "prefill_latency_ms",
    "device",
    "eval_rows",
    "eval_fraction",
)
#: A trial's timings: a reused probe took none of them.
_TIMINGS = ("duration_s", "calibration_s", "quantization_s", "evaluation_s")
#: What the candidacy rule adds to ``extra``; decided again when a probe is reused.
_DECIDED = ("quantizes_nothing", "within_tolerance")

#: ``decide(metric, quantized_share) -> (is_candidate, extra flags, sampler objective)``.
Decide = Callable[[float, "float | None"], "tuple[bool, dict[str, float], float | None]"]


def enabled() -> bool:
    """Whether ``RAYSEARCH_PROBE_CACHE`` leaves the cache on (unset: on)."""
    value = os.environ.get(ENVIRONMENT, "").strip().lower()
    return value not in ("0", "off", "false", "no")


def content_key(
    *,
    model_hash: str,
    eval_data: Any,
    calibration_data: Any,
    metric: str,
    metric_key: str | None,
    device: str,
    measure_latency: bool,
) -> dict[str, Any]:
    """What a probe's result depends on besides its settings (see the module)."""
    import importlib.metadata

    import onnx
    import onnxruntime

    def data(source: Any) -> list[Any] | None:
        if source is None:
            return None
        return [source.content_hash, source.batch_size, bool(source.sample_is_feed)]

    return {
        "format": _FORMAT,
        "raysearch": importlib.metadata.version("raysearch"),
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "model": model_hash,
        "eval_data": data(eval_data),
        "calibration_data": data(calibration_data),
        "metric": metric,
        "metric_key": metric_key,
        "device": device,
        "measure_latency": bool(measure_latency),
    }


class ProbeCache:
    """Probe results by content. ``content`` returns :func:`content_key`'s mapping (called
    once, on first use); ``origin`` names the storing search; ``decide`` a reused result's
    candidacy (None: as stored); a result measured on another ``device`` is not kept."""

    def __init__(
        self,
        content: Callable[[], Mapping[str, Any]],
        folder: str | os.PathLike,
        *,
        origin: str,
        decide: Decide | None = None,
        device: str = "cpu",
    ) -> None:
        self._content_fn = content
        self._content: str | None = None
        self.folder = Path(folder)
        self.origin = origin
        self.decide = decide
        self.device = device
        self.reused = 0
        self.kept = 0

    def _key(self, settings: Mapping[str, Any]) -> tuple[str, str]:
        """The key text of ``settings`` and its digest (the entry's file name starts with)."""
        if self._content is None:
            self._content = json.dumps(dict(self._content_fn()), sort_keys=True)
        text = json.dumps({"content": self._content, "settings": settings_key(settings)})
        return text, _content_hash(text.encode())

    def _entry(self, key: str, digest: str) -> dict[str, Any] | None:
        """The entry stored under ``key`` (a file that is not what it should be is removed)."""
        for path in sorted(self.folder.glob(f"{digest}-*.json")):
            try:
                data = path.read_bytes()
                if path.stem.rsplit("-", 1)[-1] != _content_hash(data):
                    raise ValueError("its content is not the content its name was written for")
                entry = json.loads(data)
                if entry.get("key") != key:
                    raise ValueError("it holds another key")
                if finite(entry["record"].get("metric")) is None:
                    raise ValueError("it holds no metric")
            except Exception as exc:  # a damaged or foreign file is measured again, never read
                _logger.warning("ignoring probe cache file %s: %s", path, exc)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            return entry
        return None

    def lookup(self, settings: Mapping[str, Any]) -> TrialRecord | None:
        """The record of an earlier search's probe of ``settings`` (timings 0, ``reused_from``),
        or None."""
        try:
            entry = self._entry(*self._key(settings))
        except OSError as exc:
            _logger.warning("could not read the probe cache: %s", exc)
            return None
        if entry is None:
            return None
        stored = entry["record"]
        metric = float(stored["metric"])
        extra = {k: v for k, v in (stored.get("extra") or {}).items() if k not in _DECIDED}
        record: dict[str, Any] = {k: stored.get(k) for k in _KEPT}
        record.update({k: 0.0 for k in _TIMINGS})
        record.update(status="ok", metric=metric, extra=extra, reused_from=entry.get("origin"))
        if self.decide is not None:
            candidate, flags, objective = self.decide(metric, finite(extra.get("quantized_share")))
            extra.update(flags)
            record.update(is_candidate=candidate, objective=objective)
        else:
            record.update(is_candidate=bool(stored.get("is_candidate")), objective=metric)
        self.reused += 1
        return TrialRecord.from_dict(record)

    def store(self, settings: Mapping[str, Any], record: TrialRecord, trial_id: str) -> bool:
        """Keep the result of the probe of ``settings`` (trial ``trial_id``); whether it was."""
        if not record.ok or finite(record.metric) is None:
            return False
        if record.stopped_at_rung is not None or record.reused_from:
            return False
        if str(record.device or "cpu").split(":")[0] != self.device:
            return False
        try:
            key, digest = self._key(settings)
            if self._entry(key, digest) is not None:
                return False  # the first result kept stays: later ones measured the same
            entry = {
                "key": key,
                "origin": f"{self.origin} trial {trial_id}",
                "record": {k: getattr(record, k) for k in _KEPT},
            }
            data = json.dumps(entry, sort_keys=True).encode()
            atomic_write_bytes(self.folder / f"{digest}-{_content_hash(data)}.json", data)
        except (OSError, TypeError, ValueError) as exc:
            _logger.warning("could not keep the probe's result for later searches: %s", exc)
            return False
        self.kept += 1
        return True


def search_probe_cache(
    *,
    model_path: str | os.PathLike,
    evaluation: Any,
    calibration: Any,
    evaluator: Any,
    float_score: float | None,
    measure_latency: bool,
    gpu: bool,
    origin: str,
) -> ProbeCache | None:
    """A search's probe cache; None when off, for a custom evaluator (its code may change
    under the same name), or when the private folder is refused."""
    from raysearch.modelfile import cached_file_hash
    from raysearch.modelgraph import weighted_nodes
    from raysearch.quantize.tempdirs import UnsafeFolderError, private_dir
    from raysearch.trial import decide_complete

    if not enabled() or evaluator.is_custom:
        return None
    try:
        folder = private_dir(FOLDER)
    except (UnsafeFolderError, OSError) as exc:
        _logger.warning("sensitivity probes are not kept across searches: %s", exc)
        return None
    device = "cuda" if gpu else "cpu"
    weighted: list[int] = []

    def content() -> dict[str, Any]:
        return content_key(
            model_hash=cached_file_hash(model_path),
            eval_data=evaluation,
            calibration_data=calibration,
            metric=evaluator.name,
            metric_key=evaluator.metric_key,
            device=device,
            measure_latency=measure_latency,
        )

    def decide(metric: float, share: float | None) -> tuple[bool, dict[str, float], float | None]:
        if not weighted:
            weighted.append(weighted_nodes(model_path))
        candidate, flags = decide_complete(evaluator, metric, float_score, share, weighted[0])
        objective = evaluator.sampler_objective(metric, float_score, share, weighted[0])
        return candidate, flags, objective

    return ProbeCache(content, folder, origin=origin, decide=decide, device=device)


def _content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]
