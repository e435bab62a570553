"""Ray for a search: start or join it (with the modules beside the config shipped to every
worker), check it can hold a trial, and how many trials run at once.

Example:
    >>> start_ray(None)                                   # doctest: +SKIP
    True
    >>> slots(config)                                     # doctest: +SKIP
    (8, 16)
"""

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
    "EXPERIMENT_CHECKPOINT_S",
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
#: Ray's settings for the one-machine Ray that :func:`start_ray` starts. Ray starts one idle
#: worker process per CPU when the first driver connects, for tasks and actors without a
#: ``runtime_env``; Ray Tune creates every trial actor with a ``runtime_env`` of its own
#: (``env_vars``), so no trial ever runs in one of them: on a 64-core workstation they would be
#: 64 idle processes held for the whole search (``benchmarks/README.md``, "What would make
#: raysearch faster", has what each holds), and their start competes with the first trials'.
#: An unknown key stops Ray's start (its GCS refuses it), so a rename in Ray fails loudly;
#: ``tests/test_library_contracts.py`` checks that none is started.
OWN_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
#: The one-machine Ray that :func:`start_ray` started, as :func:`_ray_now` names it (None:
#: none, or Ray was started or joined elsewhere): there every trial runs on the driver's node.
#: Only the Ray up now counts (:func:`_is_local_ray`): one shut down by a plain
#: ``ray.shutdown()`` and another started after it is not the one this names.
_local_ray: tuple[str, str] | None = None
#: Whether this process ends with its search (:func:`end_with_process`: the command line).
_ends_with_process = False
#: The thread shutting down the search's own Ray while the outputs are written (None: none
#: started): :func:`trials_ended` starts it, :func:`shutdown_ray` waits for it.
_ending: threading.Thread | None = None


def tune_environment(max_pending: int) -> None:
    """Environment Ray Tune reads when a run starts (none of these is read at import)."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    # The legacy output engine prints nothing at verbose=0 (the new one still draws a table).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", str(EXPERIMENT_CHECKPOINT_S))
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(1, max_pending))
    # One report at a time: a trial's next rung must wait for ASHA's verdict on this one
    # (buffered, an actor would run the rungs ASHA then stops, for nothing).
    os.environ["TUNE_RESULT_BUFFER_LENGTH"] = "1"
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")


def cluster_address(address: str | None) -> str | None:
    """The cluster a search joins: ``address``, else ``RAY_ADDRESS`` as Ray programs (a
    Tuner too) read it; None: the search starts a Ray of its own.

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
    """Join the Ray cluster at ``address`` (else at ``RAY_ADDRESS``), or start a local one
    of the search's own with this machine's CPUs, even when another Ray runs on this machine;
    nothing when Ray is already initialised (but for refusing an ``address`` nothing answers
    at). Returns whether this call started Ray.

    ``py_modules`` (:func:`raysearch.usercode.code_folders`: the folders of the evaluator's
    or a plugin's module found beside the config or in the working directory) are shipped,
    each whole but for the ``excluded`` paths (the model, the data and the output folder,
    which the search handles itself), as the job's ``runtime_env`` ``py_modules`` when the
    search joins a cluster: Ray uploads them once and unpacks them on each node, where a
    worker without the folder imports the module from that copy, beside the files shipped
    with it (:func:`raysearch.usercode.where_code_lives`). A local Ray's workers run on this
    machine and import the modules where they live: nothing is shipped.
    """
    import ray

    global _local_ray
    if ray.is_initialized():
        if address:  # an address named is one that answers, even to a process in Ray
            check_reachable(address)
        _warn_unshipped(py_modules)
        return False
    # Token authentication stays on (Ray's default); its notice about that default on every
    # start is noise for a local search. (Setting RAY_AUTH_MODE here would be too late: Ray
    # reads it at import, and a mismatch locks the driver out of its own cluster.) Ray has no
    # public switch for that notice: its logger is named here, nothing of ray._private is read.
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
        # "local": a Ray of the search's own. Without it ray.init joins a Ray that `ray start`
        # left running on this machine (and then refuses num_cpus, or finds several).
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            _system_config=OWN_RAY_SYSTEM_CONFIG,
            **kwargs,
        )
        _local_ray = _ray_now()
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
    """Say which of ``py_modules`` (code folders) the workers of a Ray started before the
    search import only where the folder exists (this machine's workers: a shared file system
    too): that Ray has its job's ``runtime_env`` already, so nothing can be shipped."""
    import ray

    if py_modules and sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        _logger.warning(
            "Ray was started before this search: its workers on other machines import the "
            "code in %s only if the folder exists there (ray.init(runtime_env={'py_modules': "
            "[...]}) ships it)",
            ", ".join(map(os.fspath, py_modules)),
        )


def check_reachable(address: str, wait_s: float = CLUSTER_WAIT_S) -> None:
    """Fail fast when nothing listens at a ``host:port`` cluster address.

    ``ray.init`` tries a GCS that does not answer again and again, each try a long
    timeout: a search resumed on the address of a cluster that is gone (its saved address)
    would hang for many minutes before Ray's own error. Ray has no shorter switch for a driver (its
    ``RAY_gcs_server_port_wait_time_s`` sets the number of tries, not their length), so a
    plain TCP connection is tried here, for up to ``wait_s`` seconds (a head that is
    starting). ``auto`` and ``ray://`` addresses are Ray's to check.

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
    if _is_local_ray():
        shutdown_ray()
    _local_ray = None


#: The script of Ray's autoscaler monitor, as it appears on the monitor's command line.
_MONITOR_SCRIPT = os.path.join("autoscaler", "_private", "monitor.py")


def end_with_process() -> None:
    """Say that this process ends with its search (the command line, ``cli.console_main``):
    a Ray the search starts for itself (:func:`start_ray` without an address) then shuts down
    as soon as the search's trials have ended (:func:`trials_ended`), not after its outputs
    are written. A Ray joined or started before keeps running as without it."""
    global _ends_with_process
    _ends_with_process = True


def ends_with_process() -> bool:
    """Whether this process ends with its search (:func:`end_with_process`): what it imports
    or warms up serves no later search."""
    return _ends_with_process


def trials_ended() -> None:
    """The search's trials have all ended: when this process ends with the search
    (:func:`end_with_process`) and Ray is the one-machine Ray the search started, shut it
    down now, in a thread, while the driver writes the outputs, which need nothing of Ray;
    :func:`shutdown_ray` waits for that thread. Else nothing.

    Ray's shutdown waits on its processes' ends and the driver's core worker (about half a
    second) and the outputs take about as long, so one overlaps the other. The garbage
    collector is switched off first: a cycle holding a Ray object reference, freed after the
    shutdown, would end the process (Ray's core worker is gone); this process ends soon after,
    and never frees those cycles."""
    global _ending, _local_ray
    if not _ends_with_process or _ending is not None or not _is_local_ray():
        return
    _logger.info(
        "the trials have ended: the search's own Ray shuts down while the outputs are written"
    )
    gc.disable()
    _local_ray = None  # forgotten here, before the thread: nothing asks a Ray going down
    _ending = threading.Thread(target=_shutdown_now, name="raysearch-ray-shutdown", daemon=True)
    _ending.start()


def shutdown_ray() -> None:
    """``ray.shutdown()``, less the second it spends on a local Ray's autoscaler monitor; when
    :func:`trials_ended` started shutting it down already, the wait for that shutdown's end.

    ``ray.shutdown`` stops the GCS before the monitor; the monitor's SIGTERM handler then
    reports its own end to the stopped GCS until Ray gives up on it after 1 s and kills it,
    most of the time a shutdown takes (``benchmarks/README.md``, section 1). The monitor of a
    Ray this process started (its child) is killed first instead: a one-machine Ray has
    nothing to autoscale, and a killed monitor reports nothing. A joined cluster's monitor is
    no child of this process and is left alone. psutil ships with Ray
    (``ray/thirdparty_files``)."""
    global _ending
    if _ending is not None:
        _ending.join()
        _ending = None
    _shutdown_now()


def _shutdown_now() -> None:
    """:func:`shutdown_ray` itself: the monitor of a Ray this process started killed, then
    ``ray.shutdown()``."""
    import ray

    global _local_ray
    _local_ray = None  # whichever Ray this is, none is up after it
    if not ray.is_initialized():
        return
    try:
        import psutil
    except ImportError:  # pragma: no cover - Ray without its bundled psutil
        psutil = None
    if psutil is not None:
        killed = []
        for child in psutil.Process().children():
            try:
                if any(part.endswith(_MONITOR_SCRIPT) for part in child.cmdline()):
                    child.kill()
                    killed.append(child)
            except psutil.Error:  # it ended meanwhile, or is not ours to read
                continue
        # SIGKILL is delivered asynchronously: reap the monitor (milliseconds) so that it is
        # gone when the GCS stops, not merely signalled.
        psutil.wait_procs(killed, timeout=1.0)
    ray.shutdown()


def started_locally() -> bool:
    """Whether Ray is the one-machine instance :func:`start_ray` started for this search
    (it ends with the search), not a cluster joined or a Ray initialised before."""
    return _is_local_ray()


def _ray_now() -> tuple[str, str] | None:
    """The Ray this process is connected to: its GCS address and the driver's node id (a Ray
    started again on a freed port has the address, not the node); None when none is."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_node_id()


def _is_local_ray() -> bool:
    """Whether the Ray up now is the one :func:`start_ray` started."""
    return _local_ray is not None and _ray_now() == _local_ray


def only_driver_node() -> bool:
    """Whether every trial runs on the driver's node: Ray is the one-machine instance
    :func:`start_ray` started (a cluster joined, or a Ray started elsewhere, may have or gain
    other nodes)."""
    import ray

    if not _is_local_ray():
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
            f"has more than {most_cpus:g} CPUs"
        )
    return (
        f"no node of the Ray cluster has {res.cpu_per_trial:g} CPUs and "
        f"{res.gpu_per_trial:g} GPUs for one trial (resources.cpu_per_trial, "
        "resources.gpu_per_trial)"
    )


def check_resources(config: SearchConfig) -> None:
    """Raise :class:`InputError` when no node of the Ray cluster can hold one trial
    (``resources.cpu_per_trial`` CPUs and ``resources.gpu_per_trial`` GPUs on one node): its
    trials would wait for ever. A cluster joined with ``address`` may grow (the autoscaler of
    ``cluster.yaml`` adds GPU workers when trials wait), so there it is only a warning."""
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
    """(trials that run at once, trials kept suggested but unfinished).

    Tune's ``ConcurrencyLimiter`` (``TuneConfig.max_concurrent_trials``) is not used: the
    searcher itself keeps at most the second number suggested and unfinished
    (``max_outstanding``), and Tune's pending-trial bound (``TUNE_MAX_PENDING_TRIALS_PG``)
    follows it.
    """
    import ray

    check_resources(config)
    bound = _trials_held(config, ray.cluster_resources(), cpu_default=1)
    res = config.resources
    if res.max_concurrent_trials is None or res.max_concurrent_trials >= bound:
        return bound, 2 * bound
    # A user limit below what the cluster could run: no queued trial may start early.
    return res.max_concurrent_trials, res.max_concurrent_trials


def trials_placeable_now(config: SearchConfig) -> int:
    """How many trials the cluster's free resources hold right now (at least 1): fewer than
    :func:`slots` says where other jobs hold part of a shared cluster, or nodes are still to
    come from its autoscaler."""
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
