"""A node of the Ray cluster lost mid-search: one readable line for what it took with it (a
trial running there, or a finished trial's model not yet fetched: ``model_lost``).

Example:
    >>> text = ("The actor died unexpectedly before finishing this task.\\n\\tip: 10.0.0.2\\n"
    ...         "The actor died because its node has died. Node Id: 728b6da40bdef3d6\\n"
    ...         "\\tthe actor's node was terminated unexpectedly: health check failed")
    >>> lost_trial_line(text)
    'NodeLost: the node running this trial (728b6da40bde, 10.0.0.2) was lost: the node was terminated unexpectedly: health check failed'
    >>> lost_trial_line("The actor 93 is unavailable: RPC error: Socket closed. The task may...")
    "TrialUnreachable: the connection to the trial's process broke: its node was lost or the process was killed (Ray: RPC error: Socket closed)"
    >>> lost_trial_line("ZeroDivisionError: division by zero") is None
    True
"""  # noqa: E501

from __future__ import annotations

import logging
import re
import time

import ray

__all__ = [
    "ModelLostError",
    "NodeWatch",
    "lost_trial_line",
    "lost_model_line",
    "node_alive",
    "node_lost_line",
    "broke_connection",
]

_logger = logging.getLogger("raysearch.search")

#: Seconds the driver waits for the cluster to say whether the node of a trial whose
#: connection broke is dead (Ray's health checks mark it dead after several misses).
CONFIRM_S = 45.0
#: Seconds between two looks at the cluster's nodes while the search runs.
WATCH_PERIOD_S = 2.0
#: The start of the line for a trial whose connection to its process broke.
_UNREACHABLE = "TrialUnreachable: "

_NODE_DIED = re.compile(r"its node has died\. Node Id: ([0-9a-f]+)[^\n]*(?:\n\s*(.*))?")
_UNAVAILABLE = re.compile(r"The actor \w+ is unavailable: (.*?)(?:\. The task may|$)", re.S)


class ModelLostError(RuntimeError):
    """A finished trial's model could not be brought to the output folder (why, in one line)."""


def node_alive(node_id: str) -> bool | None:
    """Whether the cluster counts node ``node_id`` alive; None when it does not know it."""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return None


def lost_trial_line(text: str) -> str | None:
    """One line for a trial whose actor went down with its node (the error text Tune recorded);
    None when ``text`` says no such thing."""
    died = _NODE_DIED.search(text)
    if died:
        ip = re.search(r"^\s*ip: (\S+)", text, re.M)
        line = node_lost_line(died.group(1), ip.group(1) if ip else None)
        # Ray's cause, e.g. "the actor's node was terminated unexpectedly: health check ...".
        cause = (died.group(2) or "").strip().replace("the actor's node", "the node")
        return (f"{line}: {cause}" if cause else line)[:2000]
    unavailable = _UNAVAILABLE.search(text)
    if unavailable:
        said = " ".join(unavailable.group(1).split())
        return (
            "TrialUnreachable: the connection to the trial's process broke: its node was lost "
            f"or the process was killed (Ray: {said})"
        )[:2000]
    return None


def lost_model_line(node_id: str, error: BaseException | None, alive: bool | None) -> str:
    """Why the model a trial left on node ``node_id`` could not be fetched (``error``: what the
    fetch raised, None: the model was gone from the node; ``alive``: :func:`node_alive`)."""
    node = node_id[:12]
    if not alive:
        return f"the node that ran this trial ({node}) was lost before its model was fetched"
    if error is None:
        return f"the model was gone from the node that ran this trial ({node})"
    message = " ".join(str(error).split())[:300]
    return f"the model could not be fetched from node {node}: {type(error).__name__}: {message}"


def node_lost_line(node_id: str, ip: str | None) -> str:
    """The line for a trial whose node ``node_id`` (at ``ip``) the cluster lost.

    Example:
        >>> node_lost_line("728b6da40bdef3d6aa", "10.0.0.2")
        'NodeLost: the node running this trial (728b6da40bde, 10.0.0.2) was lost'
    """
    where = node_id[:12] + (f", {ip}" if ip else "")
    return f"NodeLost: the node running this trial ({where}) was lost"


def broke_connection(line: str) -> bool:
    """Whether ``line`` (:func:`lost_trial_line`) says the connection to a trial's process broke."""
    return line.startswith(_UNREACHABLE)


class NodeWatch:
    """Which of the nodes alive while the search ran were lost, each said once in a warning
    line; :meth:`confirm` waits for the cluster's verdict on one."""

    def __init__(self, period_s: float = WATCH_PERIOD_S) -> None:
        self.period_s = period_s
        #: Node id -> IP of every node seen alive.
        self.seen: dict[str, str | None] = {}
        #: Node id -> IP of each node lost while the search ran, in the order found.
        self.lost: dict[str, str | None] = {}
        self._next = 0.0

    def poll(self, *, force: bool = False) -> None:
        """Look at the cluster's nodes (at most every ``period_s`` unless ``force``)."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.period_s
        for node in ray.nodes():
            node_id, ip = node.get("NodeID"), node.get("NodeManagerAddress")
            if not node_id:
                continue
            if node.get("Alive"):
                self.seen[node_id] = ip
            elif node_id in self.seen and node_id not in self.lost:
                self.lost[node_id] = ip
                _logger.warning(
                    "node %s (%s) was lost: the trials it ran run again on the other nodes",
                    node_id[:12],
                    ip,
                )

    def confirm(self, node_id: str, wait_s: float = CONFIRM_S) -> bool:
        """Whether node ``node_id`` (alive when a trial ran there) is lost: wait until the
        cluster says it is dead, or alive for ``wait_s`` seconds more."""
        self.seen.setdefault(node_id, None)
        deadline = time.monotonic() + wait_s
        while node_id not in self.lost:
            self.poll(force=True)
            if node_id in self.lost or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        return node_id in self.lost
