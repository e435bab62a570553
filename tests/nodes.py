"""Real Ray nodes on this machine, for the tests and benchmarks that run a multi-node cluster
or lose a node: ``ray start --block`` per node.

Each node is one ``ray start --block`` process in a process group of its own, with its own temp
folder and free ports, so a test can kill exactly one node's processes: the ``ray start``
process, its raylet and agents, and the worker processes the raylet started (Ray gives each
worker a process group of its own, so they are found as the raylet's descendants). Nothing of
another Ray instance on the machine is touched: not the test session's ``ray_cluster``, not
another test run's. The cluster keeps Ray's token authentication on, with a token of its own
that :attr:`NodeCluster.env` passes to the drivers that join it; or, with ``auth=False``, leaves
authentication to the shell script a node is started with (the README's steps: ``script``).
A lean cluster (``lean=True``, the tests') starts no process on its nodes that a search does
not use (:data:`LEAN_NODE`, :data:`LEAN_HEAD`).

Example:
    >>> with NodeCluster() as cluster:                                      # doctest: +SKIP
    ...     cluster.start("head", num_cpus=1)
    ...     cluster.start("worker", num_cpus=2, env={"RAYSEARCH_TEST_NODE": "lost"})
    ...     cluster.kill("worker")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["NodeCluster"]

#: The repository root: the drivers and nodes import ``tests`` (and ``benchmarks``) from it.
ROOT = Path(__file__).resolve().parents[1]

#: What a node's raylet logs (``raylet.out``) once the cluster's GCS has acknowledged its
#: registration (Ray logs it in the callback of its ``RegisterSelf`` call): from then on the
#: cluster schedules on the node. ``ray start`` prints "Ray runtime started." earlier, once it
#: has started the node's processes.
_REGISTERED = "started. Raylet consists of node_manager and object_manager"


#: What a lean cluster (``NodeCluster(lean=True)``, the tests') leaves out of every node for
#: the CPU it takes, none of which a search of raysearch uses: the log monitor, which sends
#: the workers' output to drivers (raysearch's drivers take none: ``log_to_driver`` off).
LEAN_NODE = ["--include-log-monitor=false"]
#: And of its head: the autoscaler's monitor (a cluster of fixed nodes), and an idle worker
#: per CPU started for each driver that joins, which neither a search nor its trials use
#: (Tune's actors start their own; the search's own Ray starts none either:
#: ``OWN_RAY_SYSTEM_CONFIG``). And a worker process idle on a node is kept for a minute (Ray
#: kills one past the node's CPU count after 1 s): the driver fetches a model from another
#: node with tasks there, whose one process then serves the search's next fetches instead of
#: a new one started (Python imported) for each. A benchmark's cluster keeps Ray's defaults,
#: as a user's has.
LEAN_HEAD = [
    "--no-monitor",
    "--system-config="
    + json.dumps(
        {"prestart_worker_first_driver": False, "idle_worker_killing_time_threshold_ms": 60_000}
    ),
]

#: How many times a node is started on new ports when one was taken before it bound it.
PORT_TRIES = 3
#: What a node's gRPC server (its GCS's, its raylet's) logs when its port is taken, and what
#: ``ray start`` prints when it ends over a taken port.
_GRPC_PORT_FAILED = "Failed to start the grpc server"
_PORT_TAKEN = (_GRPC_PORT_FAILED, "Address already in use")


class _PortTaken(AssertionError):
    """A node's ``ray start`` ended because a port it was given was taken meanwhile."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children() -> dict[int, list[int]]:
    """Parent pid -> pids of its children, from /proc."""
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        table.setdefault(parent, []).append(int(entry))
    return table


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    table = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(table.get(current, []))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class NodeCluster:
    """Ray nodes started with ``ray start --block``; the first one started is the head."""

    def __init__(self, *, auth: bool = True, lean: bool = False) -> None:
        # A short folder of its own: Ray's socket paths under it must stay below 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="rs-nodes-"))
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        # The environment's own executables (ray, raysearch) first on PATH, for scripts.
        bin_path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
        self.env = {**os.environ, "PYTHONPATH": path, "PATH": bin_path}
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            self.env.pop(name, None)
        if auth:
            self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        self.env.pop("RAY_ADDRESS", None)  # the test session's Ray is not this cluster
        self.lean = lean
        self.address: str | None = None
        self.nodes: dict[str, subprocess.Popen] = {}

    def start(
        self,
        name: str,
        *,
        num_cpus: int,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        script: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Start node ``name`` and wait until it has registered with the cluster (at most
        ``timeout`` seconds: a node starts in a few seconds on a quiet machine, and in tens
        on a loaded 2-core one; past that the call fails saying which node, and what its
        ``ray start`` printed).

        A free port is one nothing holds when it is picked: another Ray on the machine (a
        second test worker's) can take it before this node binds it. A node whose ``ray
        start`` ended saying a port was taken is started again on new ports, up to
        :data:`PORT_TRIES` times; any other failure fails at once.

        ``script``: a bash script that starts the node (run in ``cwd``), as a user would type
        it: its ``ray start`` line gets this machine's options added (``--block``, the node's
        own temp folder, free ports, ``num_cpus``); the head's port is the one its ``--port``
        names (a port taken is not tried again)."""
        for tries_left in reversed(range(PORT_TRIES)):
            try:
                self._start(
                    name, num_cpus=num_cpus, env=env, timeout=timeout, script=script, cwd=cwd
                )
                return
            except _PortTaken:
                if not tries_left or script is not None:
                    raise
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.nodes.pop(name).pid, signal.SIGKILL)
                shutil.rmtree(self.root / name, ignore_errors=True)

    def _start(
        self,
        name: str,
        *,
        num_cpus: int,
        env: dict[str, str] | None,
        timeout: float,
        script: str | None,
        cwd: Path | None,
    ) -> None:
        ray = Path(sys.executable).with_name("ray")
        args = [
            os.fspath(ray),
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            f"--temp-dir={self.root / name}",
            f"--dashboard-agent-listen-port={_free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
        ]
        head = self.address is None
        if self.lean:
            args += LEAN_NODE + (LEAN_HEAD if head else [])
        if script is not None:
            # The script's own `ray start` line, with this machine's options after it.
            if head:
                port = int(re.search(r"--port[= ](\d+)", script).group(1))
                args += ["--include-dashboard=false", f"--dashboard-port={_free_port()}"]
            local = shlex.join(args[2:])
            args = ["bash", "-c", re.sub(r"^(ray start .*)$", rf"\1 {local}", script, flags=re.M)]
        elif head:
            port = _free_port()
            args += ["--head", f"--port={port}", "--include-dashboard=false"]
            args.append(f"--dashboard-port={_free_port()}")
        else:
            args.append(f"--address={self.address}")
        log = self.root / f"{name}.out"
        # The node's own temp folder too (another machine has its own /tmp): what its trials
        # leave there goes with the cluster's folder.
        tmp = self.root / f"{name}-tmp"
        tmp.mkdir(exist_ok=True)
        with open(log, "w") as out:
            self.nodes[name] = subprocess.Popen(
                args,
                env={**self.env, "TMPDIR": os.fspath(tmp), **(env or {})},
                cwd=cwd,
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._wait_started(name, log, timeout)
        if head:
            self.address = f"127.0.0.1:{port}"

    def _registered(self, name: str) -> bool:
        """Whether node ``name``'s raylet says the cluster has registered it."""
        for raylet in (self.root / name).glob("session_*/logs/raylet.out"):
            with contextlib.suppress(OSError):
                if _REGISTERED in raylet.read_text(errors="replace"):
                    return True
        return False

    def _port_taken(self, name: str) -> bool:
        """Whether a gRPC server of node ``name`` failed on its port (a fatal check in Ray;
        ``ray start`` then waits some 40 s for a GCS that never comes up before it gives up)."""
        for log in (self.root / name).glob("session_*/logs/*.out"):
            with contextlib.suppress(OSError):
                if _GRPC_PORT_FAILED in log.read_text(errors="replace"):
                    return True
        return False

    def _wait_started(self, name: str, log: Path, timeout: float) -> None:
        proc = self.nodes[name]
        deadline = time.monotonic() + timeout
        while not self._registered(name):
            taken = self._port_taken(name)
            if taken:
                why = "a gRPC server of it found its port taken"
            elif proc.poll() is not None:
                why = f"its `ray start` ended (status {proc.returncode}) before it registered"
            elif time.monotonic() > deadline:
                why = f"it did not register with the cluster within {timeout:.0f} s"
            else:
                time.sleep(0.2)
                continue
            tail = log.read_text(errors="replace")[-3000:]
            taken = taken or any(words in tail for words in _PORT_TAKEN)
            raise (_PortTaken if taken else AssertionError)(
                f"Ray node {name!r} did not start: {why}; `ray start` printed:\n{tail}"
            )

    def kill(self, name: str, timeout: float = 60) -> list[int]:
        """SIGKILL every process of node ``name`` (what a machine that dies leaves behind:
        nothing) and wait until they are gone; their pids."""
        proc = self.nodes[name]
        if proc.poll() is not None:  # gone already (its pid may be another process's now)
            return []
        pids = _descendants(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pids

    def stop(self) -> None:
        """Kill every node (the workers' first), then remove the cluster's folder."""
        for name in reversed(list(self.nodes)):
            self.kill(name)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> NodeCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
