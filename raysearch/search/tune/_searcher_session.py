"""What the searcher reaches of the live session by the search's id (none without one): the
probe cache, the progress line and the start barrier."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from raysearch.ranking import is_candidate, is_probe
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.search.tune.session import SearchSession
    from raysearch.strategies import Proposal

__all__ = ["SessionLink"]

_logger = logging.getLogger("raysearch.search.tune.searchers")


class SessionLink:
    """The searcher's side of the live session (a mixin of ``SettingSearcher``)."""

    session_key: str | None

    def _session(self) -> SearchSession | None:
        from raysearch.search.tune.session import lookup

        return None if self.session_key is None else lookup(self.session_key)

    def _probe_cache(self) -> Any:
        session = self._session()
        return None if session is None else session.probe_cache

    def _reused(self, proposal: Proposal) -> TrialRecord | None:
        """An earlier search's result of ``proposal`` (a ``reusable`` one), or None."""
        cache = self._probe_cache()
        return None if cache is None else cache.lookup(proposal.settings)

    def _record_reused(self, proposal: Proposal, record: TrialRecord) -> None:
        """Journal ``record`` as a trial of ``proposal`` no actor runs, and tell the phase."""
        session = self._session()
        assert session is not None  # a probe cache is a session's
        position = self.state.phase
        number = self._start_one()
        trial_id = f"reused_{number:05d}"
        suggestion = self._suggestion(proposal, number)
        full = session.recorder.record_reused(trial_id, suggestion, record)
        self.state.finished_ids.add(trial_id)
        # the progress line counts it with the trials that ran (a probe: never its best)
        metric = None if is_probe(full) else full.metric
        session.progress.trial_finished(full.status, metric, is_candidate(full))
        result = {"metric": full.metric, "objective": full.objective, "trial": full}
        self._completed(trial_id, proposal, position, number, result, False)

    def _keep_reusable(
        self, proposal: Proposal, reported: TrialRecord | None, trial_id: str
    ) -> None:
        """A reusable trial that completed: its result kept for later searches."""
        cache = self._probe_cache()
        if cache is not None and reported is not None:
            cache.store(proposal.settings, reported, trial_id)

    def _open_start_barrier(self) -> None:
        """The phase waits for results: the actors started must not wait for more."""
        session = self._session()
        if session is not None and session.start_barrier is not None:
            session.start_barrier.open()
            session.start_barrier = None
