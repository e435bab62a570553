"""Ray for a search: start or join it (with the modules beside the config shipped to every
worker), check it can hold a trial, and how many trials run at once."""

from __future__ import annotations

import gc
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.errors import ConfigError, InputError

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = [
    "tune_environment",
    "start_ray",
    "cluster_address",
    "check_reachable",
    "shutdown_ray",
    "end_with_process",
    "ends_with_process",
    "trials_ended",
    "started_locally",
    "only_driver_node",
    "check_resources",
    "slots",
]

_logger = logging.getLogger("raysearch.search")

#: Seconds between two saves of Tune's experiment state (the journal covers the gap).
EXPERIMENT_CHECKPOINT_S = 60
#: Seconds a cluster's ``host:port`` may take to accept a connection before the search gives up.
CLUSTER_WAIT_S = 10.0
#: Ray's settings for the one-machine Ray that :func:`start_ray` starts: no idle worker per
#: CPU, which no trial would use (Tune's actors each have a ``runtime_env``).
OWN_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
#: The one-machine Ray that :func:`start_ray` started, as :func:`_ray_now` names it (None:
#: none, or Ray was started or joined elsewhere).
_local_ray: tuple[str, str] | None = None
#: Whether this process ends with its search (:func:`end_with_process`: the command line).
_ends_with_process = False
#: The thread shutting down the search's own Ray while the outputs are written (None: none).
_ending: threading.Thread | None = None


def tune_environment(max_pending: int) -> None:
    """Environment Ray Tune reads when a run starts (none of these is read at import)."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    # The legacy output engine prints nothing at verbose=0 (the new one still draws a table).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", str(EXPERIMENT_CHECKPOINT_S))
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(1, max_pending))
    # One report at a time: a trial's next rung waits for ASHA's verdict on this one.
    os.environ["TUNE_RESULT_BUFFER_LENGTH"] = "1"
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")


def cluster_address(address: str | None) -> str | None:
    """The cluster a search joins: ``address``, else ``RAY_ADDRESS``; None: a Ray of its own.

    Example:
        >>> cluster_address("auto")
        'auto'
    """
    return address or os.environ.get("RAY_ADDRESS") or None


def start_ray(
    address: str | None,
    py_modules: Sequence[str | os.PathLike] = (),
    excluded: Sequence[str | os.PathLike] = (),
) -> bool:
    """Join the Ray cluster at ``address`` (else ``RAY_ADDRESS``), shipping ``py_modules`` to
    its nodes but for the ``excluded`` paths, or start a local Ray of the search's own; nothing
    when Ray is already initialised. Returns whether this call started Ray."""
    import ray

    global _local_ray
    if ray.is_initialized():
        if address:  # an address named is one that answers, even to a process in Ray
            check_reachable(address)
        _warn_unshipped(py_modules)
        return False
    # Token authentication stays on (Ray's default); only its notice on every start is quiet.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": False,
        "configure_logging": True,
    }
    _local_ray = None
    if not address and cluster_address(None):
        _logger.info("RAY_ADDRESS names the cluster to join")
    address = cluster_address(address)
    if py_modules and address:
        kwargs["runtime_env"] = shipped_code(py_modules, excluded)
        _logger.info("shipping %s to the cluster's nodes", ", ".join(map(os.fspath, py_modules)))
    if address:
        _logger.info("joining the Ray cluster at %s", address)
        check_reachable(address)
        ray.init(address=address, **kwargs)
    else:
        # "local": a Ray of the search's own, not one `ray start` left running here.
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            _system_config=OWN_RAY_SYSTEM_CONFIG,
            **kwargs,
        )
        _local_ray = _ray_now()
        _stop_unused_processes()
    _logger.info("Ray resources: %s", ray.cluster_resources())
    return True


def shipped_code(
    folders: Sequence[str | os.PathLike], excluded: Sequence[str | os.PathLike] = ()
) -> dict[str, Any]:
    """The ``runtime_env`` that ships ``folders`` whole to a cluster's nodes, but for the
    ``excluded`` paths inside them (as Ray's ``excludes``: patterns anchored at each folder).

    Example:
        >>> shipped_code(["project"], ["project/model.onnx", "data/calib.npz"])
        {'py_modules': ['project'], 'excludes': ['/model.onnx']}
    """
    env: dict[str, Any] = {"py_modules": [os.fspath(folder) for folder in folders]}
    patterns = []
    for folder in map(Path, folders):
        for path in map(Path, excluded):
            if path.is_relative_to(folder) and path != folder:
                patterns.append("/" + path.relative_to(folder).as_posix())
    if patterns:
        env["excludes"] = list(dict.fromkeys(patterns))
    return env


def _warn_unshipped(py_modules: Sequence[str | os.PathLike]) -> None:
    """Warn that a Ray of several machines started before the search gets no ``py_modules``."""
    import ray

    if py_modules and sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        _logger.warning(
            "Ray was started before this search: its workers on other machines import the "
            "code in %s only if the folder exists there (ray.init(runtime_env={'py_modules': "
            "[...]}) ships it)",
            ", ".join(map(os.fspath, py_modules)),
        )


def check_reachable(address: str, wait_s: float = CLUSTER_WAIT_S) -> None:
    """Fail fast when nothing accepts a TCP connection at a ``host:port`` cluster address
    within ``wait_s`` seconds (``ray.init`` would retry for minutes); ``auto`` and ``ray://``
    addresses are Ray's to check.

    Raises:
        ConfigError: no process accepts connections at ``address``.
    """
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(1.0, wait_s / 2)).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                why = exc.strerror or type(exc).__name__
                raise ConfigError(
                    "address",
                    f"no Ray cluster answers at {address} ({why}): start it, or name a "
                    "running one with --address",
                ) from None
            time.sleep(0.5)


def stop_ray() -> None:
    """Shut down the local Ray that :func:`start_ray` started (a joined cluster, or a Ray
    started elsewhere, stays up)."""
    global _local_ray
    if started_locally():
        shutdown_ray()
    _local_ray = None


def end_with_process() -> None:
    """Say that this process ends with its search (the command line): a Ray the search
    starts for itself then shuts down when the trials have ended (:func:`trials_ended`)."""
    global _ends_with_process
    _ends_with_process = True


def ends_with_process() -> bool:
    """Whether this process ends with its search (:func:`end_with_process`)."""
    return _ends_with_process


def trials_ended() -> None:
    """When this process ends with the search and Ray is its own, shut Ray down in a thread
    while the driver writes the outputs (:func:`shutdown_ray` waits for it), the garbage
    collector off: a cycle holding a Ray object reference, freed after it, ends the process."""
    global _ending, _local_ray
    if not _ends_with_process or _ending is not None or not started_locally():
        return
    _logger.info(
        "the trials have ended: the search's own Ray shuts down while the outputs are written"
    )
    gc.disable()
    _local_ray = None  # forgotten here, before the thread: nothing asks a Ray going down
    _ending = threading.Thread(target=_shutdown_now, name="raysearch-ray-shutdown", daemon=True)
    _ending.start()


def _stop_unused_processes() -> None:
    """Stop two processes of the search's own Ray that no search uses, each of which takes
    CPU for as long as it runs: the log monitor (it sends the workers' output to drivers, and
    a search's driver takes none: ``log_to_driver`` off) and the autoscaler's monitor (a Ray
    of one machine has nothing to scale; left running, ``ray.shutdown`` also waits a second
    on its SIGTERM handler, which reports to the GCS already stopped)."""
    import ray

    node = ray._private.worker._global_node
    node.kill_log_monitor(check_alive=False)
    node.kill_monitor(check_alive=False)


def shutdown_ray() -> None:
    """``ray.shutdown()``, or the wait for the shutdown :func:`trials_ended` started."""
    global _ending
    if _ending is not None:
        _ending.join()
        _ending = None
    _shutdown_now()


def _shutdown_now() -> None:
    import ray

    global _local_ray
    _local_ray = None  # whichever Ray this is, none is up after it
    if ray.is_initialized():
        ray.shutdown()


def _ray_now() -> tuple[str, str] | None:
    """The Ray this process is connected to: its GCS address and the driver's node id (a Ray
    started again on a freed port has the address, not the node); None when none is."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_node_id()


def started_locally() -> bool:
    """Whether the Ray up now is the one-machine Ray :func:`start_ray` started."""
    return _local_ray is not None and _ray_now() == _local_ray


def only_driver_node() -> bool:
    """Whether every trial runs on the driver's node (the Ray :func:`start_ray` started)."""
    import ray

    if not started_locally():
        return False
    return sum(1 for n in ray.nodes() if n.get("Alive")) <= 1


def _no_node_message(config: SearchConfig, nodes: list[dict[str, Any]]) -> str:
    """Why no node in ``nodes`` (their resources) can hold one trial."""
    res = config.resources
    most_gpus = max(n.get("GPU", 0) for n in nodes)
    most_cpus = max(n.get("CPU", 0) for n in nodes)
    total_gpus = sum(n.get("GPU", 0) for n in nodes)
    if res.gpu_per_trial and most_gpus < res.gpu_per_trial:
        have = (
            "the Ray cluster has no GPU"
            if not total_gpus
            else f"no node of the Ray cluster has more than {most_gpus:g} GPUs "
            f"({total_gpus:g} in all)"
        )
        return f"resources.gpu_per_trial is {res.gpu_per_trial:g} but {have}"
    if most_cpus < res.cpu_per_trial:
        return (
            f"resources.cpu_per_trial is {res.cpu_per_trial:g} but no node of the Ray cluster "
            f"has more than {most_cpus:g} CPU{'s' * (most_cpus != 1)}"
        )
    return (
        f"no node of the Ray cluster has {res.cpu_per_trial:g} CPUs and "
        f"{res.gpu_per_trial:g} GPUs for one trial (resources.cpu_per_trial, "
        "resources.gpu_per_trial)"
    )


def check_resources(config: SearchConfig) -> None:
    """Raise :class:`InputError` when no node of the Ray cluster can hold one trial; a warning
    on a cluster joined with ``address``, which its autoscaler may grow."""
    import ray

    res = config.resources
    nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        nodes = [ray.cluster_resources()]
    if any(
        n.get("CPU", 0) >= res.cpu_per_trial and n.get("GPU", 0) >= res.gpu_per_trial for n in nodes
    ):
        return
    message = _no_node_message(config, nodes)
    if config.address:
        _logger.warning("%s yet; trials wait for the cluster's autoscaler to add a node", message)
        return
    raise InputError(message)


def slots(config: SearchConfig) -> tuple[int, int]:
    """(trials that run at once, trials kept suggested but unfinished: ``make_tuner``'s
    ``max_outstanding``, which Tune's pending-trial bound follows)."""
    import ray

    check_resources(config)
    bound = _trials_held(config, ray.cluster_resources(), cpu_default=1)
    res = config.resources
    if res.max_concurrent_trials is None or res.max_concurrent_trials >= bound:
        return bound, 2 * bound
    # A user limit below what the cluster could run: no queued trial may start early.
    return res.max_concurrent_trials, res.max_concurrent_trials


def trials_placeable_now(config: SearchConfig) -> int:
    """How many trials the cluster's free resources hold right now (at least 1)."""
    import ray

    return _trials_held(config, ray.available_resources(), cpu_default=0)


def _trials_held(config: SearchConfig, resources: dict[str, float], cpu_default: float) -> int:
    """Trials of ``config``'s resources that ``resources`` hold at once (at least 1)."""
    res = config.resources
    bound = int(resources.get("CPU", cpu_default) // res.cpu_per_trial) if res.cpu_per_trial else 1
    if res.gpu_per_trial:
        gpus = resources.get("GPU", 0)
        bound = min(bound, int(math.floor(gpus / res.gpu_per_trial + 1e-9)))
    return max(1, bound)
