"""Where each trial's process runs, and what Tune ran a trial again after: a lost node (up to
:data:`NODE_LOSS_RETRIES` times) told apart from its own process's failures
(``max_failures``). Tune's budget is both together, so a trial whose own failures used up
``max_failures`` is handed back marked (:data:`RETRIES_SPENT`) and its next run ends at once.

Example:
    >>> log = RetryLog(None, max_failures=1)
    >>> log.failed("t1", "TrialCrashed: the trial's process (pid 7) died unexpectedly") is None
    True
    >>> log.fields("t1")
    {'retries': 1, 'retried_after': "TrialCrashed: the trial's process (pid 7) died unexpectedly"}
    >>> log.failed("t1", "TrialCrashed: the trial's process (pid 9) died unexpectedly")
    "TrialCrashed: the trial's process (pid 9) died unexpectedly"
    >>> log.fields("t1")["retries"], log.fields("t2")
    (1, {'retries': 0, 'retried_after': None})
"""

from __future__ import annotations

from typing import Any

import ray

from raysearch.search.runtime._node_loss import NodeWatch, broke_connection, node_lost_line

__all__ = ["RetryLog", "NODE_LOSS_RETRIES", "RETRIES_SPENT", "tune_max_failures"]

#: Separates the lines of a trial's several failures in ``retried_after``.
SEPARATOR = " | "
#: How many times a trial lost with its node runs again (besides ``max_failures``).
NODE_LOSS_RETRIES = 3
#: The key of a trial's config that says its own failures used up ``max_failures``: the
#: error line its next run ends with at once.
RETRIES_SPENT = "retries_spent"


def tune_max_failures(max_failures: int) -> int:
    """Ray Tune's ``FailureConfig.max_failures``: own failures and node losses together."""
    return max_failures + NODE_LOSS_RETRIES


def _lost_kind(line: str) -> bool:
    return line.startswith("NodeLost") or broke_connection(line)


class RetryLog:
    """Each trial's node and the failures Ray Tune ran it again after. ``watch``: the
    cluster's nodes (None on a Ray of the search's own, where no node is lost)."""

    def __init__(self, watch: NodeWatch | None, max_failures: int = 0) -> None:
        self.watch = watch
        self.max_failures = max_failures
        self._asked: dict[str, Any] = {}
        self._nodes: dict[str, str] = {}
        self._failures: dict[str, list[tuple[str | None, str]]] = {}
        #: Trials whose own failures used up ``max_failures``: their last run ends at once.
        self._spent: set[str] = set()

    def started(self, trial: Any) -> None:
        """Ask the actor Tune started (or reused) for ``trial`` which node it runs on."""
        if self.watch is None:
            return
        # Ray Tune's handle of the trial's actor (tests/test_library_contracts.py).
        actor = getattr(getattr(trial, "temporary_state", None), "ray_actor", None)
        if actor is not None and hasattr(actor, "node_id"):
            self._asked[trial.trial_id] = actor.node_id.remote()

    def node_of(self, trial_id: str) -> str | None:
        """The node the trial's actor said it runs on (None: not known)."""
        asked = self._asked.get(trial_id)
        if asked is not None and ray.wait([asked], timeout=0)[0]:
            del self._asked[trial_id]
            try:
                self._nodes[trial_id] = ray.get(asked)
            except Exception:  # the process ended before it answered: its node stays unknown
                pass
        return self._nodes.get(trial_id)

    def failed(self, trial_id: str, line: str) -> str | None:
        """Tune runs ``trial_id`` again after the failure ``line``: None when it may, else the
        line its next run ends with. One lost node reported several times is kept once."""
        node = self.node_of(trial_id)
        entries = self._failures.setdefault(trial_id, [])
        if entries and entries[-1][0] == node and _lost_kind(entries[-1][1]) and _lost_kind(line):
            return None
        entries.append((node, line))
        own = sum(1 for _, said in entries if not _lost_kind(said))
        if _lost_kind(line) or own <= self.max_failures:
            return None
        self._spent.add(trial_id)
        return line

    def line(self, trial_id: str, line: str) -> str:
        """A failed trial's error ``line``, ``NodeLost`` when its node's loss broke it."""
        return self._resolved(self.node_of(trial_id), line)

    def _resolved(self, node: str | None, line: str) -> str:
        if node and self.watch is not None and broke_connection(line) and self.watch.confirm(node):
            return node_lost_line(node, self.watch.lost[node])
        return line

    def fields(self, trial_id: str) -> dict[str, Any]:
        """What a trial's record keeps of its reruns: how many, and after what."""
        entries = self._failures.get(trial_id, [])
        if trial_id in self._spent:
            entries = entries[:-1]  # the failure it did not run again after
        lines = [self._resolved(node, line) for node, line in entries]
        return {"retries": len(lines), "retried_after": SEPARATOR.join(lines) or None}

    def lost_nodes(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each node lost while the search ran: its id, IP and the trials it took with it."""
        if self.watch is None:
            return []
        self.watch.poll(force=True)
        found = []
        for node_id, ip in self.watch.lost.items():
            retried = [
                trial_id
                for trial_id, entries in self._failures.items()
                if any(node == node_id and _lost_kind(line) for node, line in entries)
            ]
            failed = [
                r.trial_id
                for r in records
                if r.status == "failed"
                and r.node_id == node_id
                and str(r.error or "").startswith("NodeLost")
            ]
            found.append(
                {
                    "node_id": node_id,
                    "ip": ip,
                    "trials_retried": sorted(retried),
                    "trials_failed": sorted(failed),
                }
            )
        return found
