"""What a running Ray cluster keeps warm between searches: the float reference of a model
already searched, in one detached actor per cluster (:data:`STORE_NAME`), keyed by the
reference's content and ONNX Runtime's version, at most ``RAYSEARCH_WARM_MAX_MB`` megabytes
(least recently used first out; ``0``: off). A Ray the search started itself keeps nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.evaluate import FloatReference

__all__ = ["KeptWarm", "STORE_NAME", "max_bytes"]

_logger = logging.getLogger("raysearch.search")

STORE_NAME = "raysearch-kept-warm"
STORE_NAMESPACE = "raysearch"
#: Seconds a lookup waits for Ray to be joined, then for the store's answer.
_WAIT_S = 60.0
_ANSWER_S = 20.0


def max_bytes() -> int:
    """The store's bound in bytes (``RAYSEARCH_WARM_MAX_MB``, default 1024 MB; 0: off).

    Example:
        >>> max_bytes() == int(os.environ.get("RAYSEARCH_WARM_MAX_MB", "1024")) * (1 << 20)
        True
    """
    try:
        megabytes = float(os.environ.get("RAYSEARCH_WARM_MAX_MB", "1024"))
    except ValueError:
        megabytes = 1024.0
    return max(0, int(megabytes * (1 << 20)))


class _Store:
    """The cluster's entries, least recently used first, within ``limit`` bytes (the actor)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.size = 0

    def get(self, key: str) -> Any:
        found = self.entries.get(key)
        if found is None:
            return None
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: str, value: Any, nbytes: int) -> bool:
        if nbytes > self.limit or key in self.entries:
            return key in self.entries
        # Owned here: an argument's buffers belong to the search that sent it.
        value = _copy_arrays(value)
        self.entries[key] = (value, nbytes)
        self.size += nbytes
        while self.size > self.limit:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.size -= dropped
        return True


def _copy_arrays(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if isinstance(value, dict):
        return {k: _copy_arrays(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_arrays(v) for v in value)
    return value


def _nbytes(value: Any) -> int:
    """Bytes of the arrays in ``value`` (plus a little per entry)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return 64 + sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 64 + sum(_nbytes(v) for v in value)
    return 64


def _reference_key(key: str) -> str:
    import onnxruntime

    return f"reference|{key}|onnxruntime {onnxruntime.__version__}"


class KeptWarm:
    """The driver's side of the cluster's store for one search; :meth:`lookup_reference`
    waits for :meth:`open` or :meth:`close`."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._store: Any = None
        self._keeping: threading.Thread | None = None
        self.enabled = max_bytes() > 0
        #: What this search took from the store (recorded in ``summary.json``).
        self.reused: dict[str, Any] = {"float_reference": False}

    def open(self) -> None:
        """Ray is joined: find the cluster's store (none yet: nothing to reuse)."""
        import ray

        if self.enabled:
            try:
                self._store = ray.get_actor(STORE_NAME, namespace=STORE_NAMESPACE)
            except ValueError:  # no search kept anything on this cluster yet
                self._store = None
        self._ready.set()

    def close(self) -> None:
        """Nothing is kept for this search (its Ray ends with it)."""
        self.enabled = False
        self._ready.set()

    def lookup_reference(self, model: str, data: DataSource) -> FloatReference | None:
        """The float reference kept for ``model`` on ``data`` (computed on a CPU), or None."""
        from raysearch.evaluate import FloatReference
        from raysearch.modelfile import file_hash

        if not self._ready.wait(_WAIT_S) or self._store is None:
            return None
        key = FloatReference.cache_key(file_hash(model), data, "cpu")
        found = self._get(_reference_key(key))
        if found is None:
            return None
        self.reused["float_reference"] = True
        return FloatReference(**found)

    def log_reused(self) -> None:
        """Say in the search's log (opened after the lookup) what it took from the cluster."""
        if self.reused["float_reference"]:
            _logger.info(
                "float reference reused from the cluster (kept by an earlier search, %s)",
                _where_kept(),
            )

    def keep_reference(self, reference: FloatReference | None) -> None:
        """Hand ``reference`` to the cluster's store, in a thread (joined by :meth:`wait`)."""
        if not self.enabled or reference is None or self.reused["float_reference"]:
            return
        self._keeping = threading.Thread(
            target=self._put,
            args=(_reference_key(reference.key), dict(vars(reference))),
            name="raysearch-keep-warm",
            daemon=True,
        )
        self._keeping.start()

    def wait(self, timeout: float = 30.0) -> None:
        """Wait until the store holds what :meth:`keep_reference` sent."""
        if self._keeping is not None:
            self._keeping.join(timeout)
            self._keeping = None

    def _get(self, key: str) -> Any:
        import ray

        try:
            return ray.get(self._store.get.remote(key), timeout=_ANSWER_S)
        except Exception as exc:  # noqa: BLE001 - a store that fails is a store missed
            _logger.warning("the cluster's kept entries are unavailable: %s", exc)
            self._store = None
            return None

    def _put(self, key: str, value: Any) -> None:
        import ray

        try:
            store = self._store or _store_actor()
            if ray.get(store.put.remote(key, value, _nbytes(value)), timeout=_WAIT_S):
                _logger.info(
                    "kept on the cluster for later searches: %s (%s)",
                    key.split("|")[0],
                    _where_kept(),
                )
        except Exception as exc:  # noqa: BLE001 - keeping is a favour to the next search
            _logger.warning("could not keep %s on the cluster: %s", key.split("|")[0], exc)


def _where_kept() -> str:
    """Where the cluster keeps entries, and its bound, for the log lines."""
    return (
        f"in the actor {STORE_NAME}, namespace {STORE_NAMESPACE}, at most "
        f"{max_bytes() >> 20} MB: RAYSEARCH_WARM_MAX_MB"
    )


def _store_actor() -> Any:
    """The cluster's store, created by the first search that keeps something."""
    import ray

    actor = ray.remote(num_cpus=0, max_restarts=0)(_Store)
    return actor.options(
        name=STORE_NAME, namespace=STORE_NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(max_bytes())
