"""A node of the Ray cluster lost mid-search: one readable line for what it took with it.

Two things can go with a node. A trial running there: its actor's task fails and Ray Tune
records Ray's error, ``ActorDiedError`` ("The actor died because its node has died. Node Id:
...") once the cluster has marked the node dead, or ``ActorUnavailableError`` ("The actor ...
is unavailable: ... Socket closed") when the driver's connection broke first (the cluster
marks a node dead only after it missed several health checks). And a model a finished trial
left in that node's temp folder, not yet fetched by the driver (see
:mod:`raysearch.search.runtime.transfer`): it cannot be fetched any more, and the trial's record says
so (``model_lost``) rather than point at a file that does not exist.

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

import re

import ray

__all__ = ["ModelLostError", "lost_trial_line", "lost_model_line", "node_alive"]

_NODE_DIED = re.compile(r"its node has died\. Node Id: ([0-9a-f]+)[^\n]*(?:\n\s*(.*))?")
_UNAVAILABLE = re.compile(r"The actor \w+ is unavailable: (.*?)(?:\. The task may|$)", re.S)


class ModelLostError(RuntimeError):
    """A finished trial's model could not be brought to the output folder; the message says
    why in one line."""


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
        where = died.group(1)[:12] + (f", {ip.group(1)}" if ip else "")
        # Ray's cause, e.g. "the actor's node was terminated unexpectedly: health check ...".
        cause = (died.group(2) or "").strip().replace("the actor's node", "the node")
        line = f"NodeLost: the node running this trial ({where}) was lost"
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
