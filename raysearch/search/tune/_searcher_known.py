"""What a search knows of its settings (:class:`KnownSettings`, a mixin of ``SettingSearcher``):
the finished ones' metric, objective and values by key, the running ones, the records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raysearch.ranking import finite, stopped_at_rung
from raysearch.search.record.reported import reported_record
from raysearch.search.tune._told import candidacy, sampler_values
from raysearch.strategies import Phase, Proposal, StrategyContext
from raysearch.trialrecord import TrialRecord

__all__ = ["KnownSettings"]


class KnownSettings:
    """The settings a search has finished and runs, and its records (see the module)."""

    state: Any
    context: StrategyContext
    phases: list[Phase]
    done: dict[str, float | None]
    objectives: dict[str, float | None]
    values: dict[str, tuple[float, ...] | None]

    @property
    def _several(self) -> bool:
        return len(getattr(self.context, "objectives", ())) > 1

    @property
    def live_keys(self) -> set[str]:
        return {p.key for p in self.state.live.values()}

    @property
    def known_keys(self) -> set[str]:
        return set(self.done) | self.live_keys

    def knows(self, key: str) -> bool:
        # Not ``key in self.known_keys``, which copies every key: quadratic over a grid.
        return key in self.done or any(p.key == key for p in self.state.live.values())

    @property
    def finish_reason(self) -> str | None:
        """``iteration_limit`` or ``space_exhausted`` once no more trials will be suggested."""
        return self.state.finish_reason

    @property
    def n_started(self) -> int:
        return self.state.started

    def add_finished(self, records: Sequence[TrialRecord]) -> int:
        """Tell the search the journal's records before its first suggestion: they count as
        started, their settings as done, and the phases see them. Returns how many were new."""
        new = 0
        for record in records:
            trial_id = str(record.trial_id)
            if trial_id in self.state.finished_ids:
                continue
            self.state.finished_ids.add(trial_id)
            self.state.started += 1
            phase = int(record.phase or 0)
            if 0 <= phase < len(self.state.phase_started):
                self.state.phase_started[phase] += 1
            key = record.key
            if key is not None:
                self.done[key] = finite(record.metric)
                self.objectives[key] = finite(record.objective)
                if self._several:
                    self.values[key] = sampler_values(
                        record, self.objectives[key], self.context.objectives
                    )
            self.context.records.append(record)
            new += 1
        if new:
            self._find_holes()
        return new

    def _find_holes(self) -> None:
        """The trial numbers below the highest one known that no trial holds."""
        used = {r.number for r in self.context.records}
        used |= set(self.state.live_number.values())
        numbers = {n for n in used if isinstance(n, int) and not isinstance(n, bool)}
        self.state.holes = [n for n in range(1, max(numbers, default=0) + 1) if n not in numbers]

    def _completed(
        self,
        trial_id: str,
        proposal: Proposal,
        position: int | None,
        number: int | None,
        result: dict[str, Any] | None,
        error: bool,
    ) -> None:
        """Learn a finished trial of ``proposal``: its record, and the phase told."""
        metric = None if (error or not result) else finite(result.get("metric"))
        objective = None if (error or not result) else finite(result.get("objective"))
        self.done[proposal.key] = metric
        self.objectives[proposal.key] = objective
        reported = None if error else reported_record(result)
        told: dict[str, Any] = {"objective": objective}
        if self._several:
            values = sampler_values(reported, objective, self.context.objectives)
            self.values[proposal.key] = told["values"] = values
        candidate, extra = candidacy(None if error else result)
        self.context.records.append(
            TrialRecord(
                trial_id=trial_id,
                number=number,  # ties go to the trial started first, as in the outputs
                key=proposal.key,
                phase=proposal.phase,
                stage=proposal.stage or self._stage(position),
                params=proposal.params,
                settings=proposal.settings,
                metric=metric,
                objective=objective,
                status="failed" if error or metric is None else "ok",
                is_candidate=candidate and metric is not None,
                extra=extra,
                stopped_at_rung=None if reported is None else stopped_at_rung(reported),
                model_size_bytes=None if reported is None else reported.model_size_bytes,
                decode_latency_ms=None if reported is None else reported.decode_latency_ms,
                reused_from=None if reported is None else reported.reused_from,
            )
        )
        if position is not None and self.state.finish_reason != "strategy_failed":
            # ``values`` only with several objectives: a plugin's phase need not take it.
            try:
                self.phases[position].completed(proposal, metric, error, **told)
            except Exception as exc:  # as in suggest: the trials that ran are kept
                self._failed(exc)
