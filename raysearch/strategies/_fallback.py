"""The ``Fallback`` strategy: Intel Neural Compressor's accuracy-driven tuning, in parallel.

A. **Search**: the spaces sampled by TPE, with half of ``stop.iteration_limit`` (or
   :data:`SEARCH_TRIALS`) split between the spaces.
B. **Fallback** (:class:`FallbackPhase`): from the best record of A without its
   ``mixed_precision`` (the *base*), the smallest ``top_k`` whose setting
   ``base + {"mixed_precision": {"top_k": k, ...}}`` is a candidate (promoted to ``float``,
   ranked by ``sqnr``, unless the best's own ``mixed_precision`` says otherwise): first every
   ranked tensor (:data:`ALL`; no candidate ends the strategy), then :class:`Bisection`.
C. **Revert** (:class:`RevertPhase`, INC's MSE_V2): for the found k (2 <= k <= 16) each
   promoted rank returned to int8 on its own, then one trial combining every demotion that
   held the tolerance.

Every phase derives its state from the finished records, matched by setting, so a resumed
search goes on where it stopped and never runs a setting twice.

Example:
    >>> b = Bisection()
    >>> b.next(set())            # first: promote everything
    1000000
    >>> b.record(ALL, True, ranked=9)
    >>> b.next(set()), b.next({4}), b.next({4, 6})   # a round of 2 by default
    (4, 6, None)
    >>> b.record(4, True)
    >>> b.next({6})              # the next round waits for the whole round
    >>> b.record(6, True)
    >>> b.next(set()), b.next({2})
    (2, 1)
    >>> for k in (2, 1):
    ...     b.record(k, True)
    >>> b.next(set()), b.found
    ('done', 1)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.quantize.techniques.mixed_precision import KEY, PER_RANK
from raysearch.ranking import is_candidate
from raysearch.strategies._registry import (
    EXHAUSTED,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    register_strategy,
)
from raysearch.strategies._setting_phase import (
    RecordReader,
    extra_count,
    meets_tolerance,
    records_before,
    setting_proposal,
    setting_refusal,
)
from raysearch.strategies.samplers import sampler_strategy
from raysearch.trialrecord import TrialRecord

__all__ = ["ALL", "Base", "DONE", "Bisection", "FallbackPhase"]

_logger = logging.getLogger(__name__)

#: ``top_k`` of the first fallback trial: every ranked tensor promoted.
ALL = 1_000_000
#: What :meth:`Bisection.next` returns once the smallest k is known (or cannot be).
DONE = "done"
#: Phase A's trials without an iteration limit.
SEARCH_TRIALS = 8


class Bisection:
    """The smallest k whose trial is a candidate, in rounds, from results told in any order.

    ``next(pending)`` is the k to try next given the ks still running: :data:`ALL` first
    (its result tells n), then rounds of up to ``parallel`` ks, each the middle of the widest
    open gap; None to wait; :data:`DONE` when ``found`` is known (None: not even :data:`ALL`
    was a candidate). ``record(k, candidate, ranked)`` tells a result (``given``: one known
    before the first round). A round starts once every k of the one before has its result,
    and rounds are replayed from the results, so the ks tried depend on the results alone,
    not on the order trials finish in nor on a resume half-way through a round."""

    def __init__(self, parallel: int = 2) -> None:
        self.parallel = max(1, parallel)
        self.n: int | None = None
        self.all_result: bool | None = None
        self.results: dict[int, bool] = {}
        #: The ks whose results were known before the first round (``record(given=True)``).
        self.given: set[int] = set()

    def record(
        self, k: int, candidate: bool, ranked: int | None = None, *, given: bool = False
    ) -> None:
        if k >= ALL:
            self.all_result = candidate
            if ranked is not None:
                self.n = ranked
            return
        self.results[k] = candidate
        if given:
            self.given.add(k)

    def _outcomes(self, results: Mapping[int, bool]) -> dict[int, bool]:
        """``results`` by effective k (top_k above n promotes the n ranked tensors)."""
        out: dict[int, bool] = {}
        if self.n is not None:
            for k, candidate in results.items():
                out[min(k, self.n)] = out.get(min(k, self.n), False) or candidate
            if self.all_result is not None:
                out[self.n] = out.get(self.n, False) or self.all_result
        return out

    def bounds(self, results: Mapping[int, bool] | None = None) -> tuple[int, int] | None:
        """``(lo, hi)``: the largest k known to fail below the smallest known candidate, and
        that candidate (None before the all-promoted result)."""
        outcomes = self._outcomes(self.results if results is None else results)
        good = [k for k, ok in outcomes.items() if ok]
        if not good:
            return None
        hi = min(good)
        lo = max([k for k, ok in outcomes.items() if not ok and k < hi], default=0)
        return lo, hi

    @property
    def found(self) -> int | None:
        """The smallest candidate k once the interval is closed (:data:`ALL` when n is not
        known), else None."""
        if self.all_result and self.n is None:
            return ALL
        bounds = self.bounds()
        if bounds is None or bounds[1] - bounds[0] > 1:
            return None
        return bounds[1]

    def _split(self, lo: int, hi: int) -> list[int]:
        """The ks of a round over the open interval ``(lo, hi)``."""
        points = {lo, hi}
        out: list[int] = []
        for _ in range(self.parallel):
            ordered = sorted(points)
            a, b = max(zip(ordered, ordered[1:]), key=lambda gap: gap[1] - gap[0])
            if b - a <= 1:
                break
            out.append((a + b) // 2)
            points.add(out[-1])
        return out

    def round(self) -> list[int]:
        """The ks of the current round (after :data:`ALL`'s candidate result), the rounds
        replayed from the results; empty when the replayed bounds are closed."""
        known = {k: ok for k, ok in self.results.items() if k in self.given}
        while True:
            bounds = self.bounds(known)
            if bounds is None:
                return []
            members = self._split(*bounds)
            if not members or any(k not in self.results for k in members):
                return members
            known.update((k, self.results[k]) for k in members)

    def next(self, pending: set[int]) -> int | str | None:
        if self.all_result is None:
            return None if ALL in pending else ALL
        if not self.all_result or self.found is not None:
            return DONE
        members = self.round()
        if not members:
            return DONE  # closed by results no round asked for: nothing is left to try
        for k in members:
            if k not in self.results and k not in pending:
                return k
        return None  # the round's other ks run: the next round waits for their results


@dataclasses.dataclass
class Base:
    """The setting phase B and C build on: the best record of phase A without its mixed
    precision, and the promotion ``P`` / ranking ``R`` to use."""

    settings: dict[str, Any]
    promote_to: str
    rank_by: str
    #: 16-bit promotions give the node's weight 16 bits too (A16W16 on that node).
    promote_weights: bool = False

    def with_k(self, k: int, demoted: Sequence[int] = ()) -> dict[str, Any]:
        options: dict[str, Any] = {"top_k": k, "promote_to": self.promote_to}
        if self.promote_weights:
            options["promote_weights"] = True
        options["rank_by"] = self.rank_by
        for rank in sorted(demoted):
            options[f"rank_{rank}"] = "int8"
        return {**self.settings, KEY: options}

    def match(self, settings: Any) -> tuple[int, frozenset[int]] | None:
        """``(k, demoted ranks)`` when ``settings`` is ``with_k(k, demoted)``, else None."""
        if not isinstance(settings, Mapping) or not isinstance(settings.get(KEY), Mapping):
            return None
        rest = {name: value for name, value in settings.items() if name != KEY}
        options = dict(settings[KEY])
        k = options.pop("top_k", None)
        if rest != self.settings or not isinstance(k, int) or isinstance(k, bool):
            return None
        if options.pop("promote_to", None) != self.promote_to:
            return None
        if bool(options.pop("promote_weights", False)) != self.promote_weights:
            return None
        if options.pop("rank_by", None) != self.rank_by:
            return None
        demoted: set[int] = set()
        for name, value in options.items():
            if not name.startswith("rank_") or value != "int8":
                return None
            demoted.add(int(name[len("rank_") :]))
        return k, frozenset(demoted)


class FallbackPhase(RecordReader, Phase):
    """Phase B: bisection over ``top_k`` from the best record of the phases before it;
    ``index``: its position in the strategy."""

    def __init__(
        self,
        index: int,
        promote_to: str = "float",
        rank_by: str = "sqnr",
        parallel: int = 2,
        *,
        force: bool = False,
        only_without_candidate: bool = False,
        promote_weights: bool = False,
    ) -> None:
        self.index = index
        self.defaults = (promote_to, rank_by)
        #: The weights of 16-bit promoted nodes at 16 bits too (with ``force``).
        self.promote_weights = promote_weights
        #: ``force``: promote to ``promote_to`` ranked by ``rank_by`` whatever the best
        #: record's own mixed precision says.
        self.force = force
        #: Skip the phase when any earlier trial is a candidate (a last resort).
        self.only_without_candidate = only_without_candidate
        self.base: Base | None = None
        self.bisection = Bisection(parallel)
        #: The k found (None: none, or not yet); ``finished`` once the phase is done.
        self.found: int | None = None
        self.finished = False
        self.keys: dict[int, str] = {}

    def start(self, context: StrategyContext) -> None:
        self.context = context
        # A round of 2 on one slot would run its second k after the first could decide it.
        self.bisection.parallel = max(1, min(self.bisection.parallel, context.concurrent))

    def _init(self) -> bool:
        """Pick the base from the records of the phases before this one; False when there is
        nothing to fall back from."""
        assert self.context is not None
        earlier = records_before(self.context.records, self.index)
        best = self._best(earlier)
        if best is None:
            _logger.info("fallback: no finished trial to fall back from")
            return False
        if is_candidate(best) and not extra_count(best, "promoted"):
            _logger.info("fallback: the best setting is a candidate already; nothing to do")
            return False
        if self.only_without_candidate and any(map(self._blocks, earlier)):
            _logger.info("fallback to %s: a candidate exists already; skipped", self.defaults[0])
            return False
        base = self._base_of(best)
        refusal = setting_refusal(base.with_k(ALL), self.context)
        if refusal is not None:
            # A base that cannot promote (no QDQ graph) gives way to the best one that can.
            usable = [r for r in earlier if self._promotable(r)]
            chosen = self._best(usable)
            if chosen is None:
                _logger.info(
                    "stage %s skipped: none of the %d finished settings can promote tensors "
                    "(trial %s, the best, cannot: %s)",
                    self._name,
                    len(earlier),
                    best.trial_id,
                    refusal,
                )
                return False
            _logger.info(
                "stage %s: trial %s (metric %s), the best, cannot promote tensors (%s); "
                "trial %s is the best that can",
                self._name,
                best.trial_id,
                best.metric,
                refusal,
                chosen.trial_id,
            )
            best, base = chosen, self._base_of(chosen)
        self.base = base
        promote_to, rank_by, weights = base.promote_to, base.rank_by, base.promote_weights
        _logger.info(
            "fallback: from trial %s (metric %s), promoting to %s%s ranked by %s",
            best.trial_id,
            best.metric,
            promote_to,
            " with their nodes' weights" if weights else "",
            rank_by,
        )
        return True

    @property
    def _name(self) -> str:
        """The stage's name in the log (a staged strategy's, else ``fallback``)."""
        return str(getattr(self, "stage", None) or "fallback")

    def _base_of(self, record: TrialRecord) -> Base:
        """The base of ``record``: its settings without mixed precision, and the promotion
        and ranking to use (its own unless ``force``)."""
        settings = dict(record.settings or {})
        own = settings.pop(KEY, None)
        own = own if isinstance(own, Mapping) and not self.force else {}
        promote_to = str(own.get("promote_to") or self.defaults[0])
        rank_by = str(own.get("rank_by") or self.defaults[1])
        weights = bool(own.get("promote_weights", self.promote_weights))
        return Base(settings, promote_to, rank_by, weights and promote_to != "float")

    def _promotable(self, record: TrialRecord) -> bool:
        """Whether ``record`` is a finished setting whose base can promote tensors."""
        if not record.ok or not record.settings:
            return False
        return setting_refusal(self._base_of(record).with_k(ALL), self.context) is None

    def _best(self, earlier: Sequence[TrialRecord]) -> TrialRecord | None:
        """The record to fall back from: the best of ``earlier``."""
        from raysearch.ranking import best_record

        assert self.context is not None
        return best_record(earlier, self.context.mode == "max")

    def _blocks(self, record: TrialRecord) -> bool:
        """Whether ``record`` skips the phase when ``only_without_candidate``: a candidate."""
        return is_candidate(record)

    def _absorb(self) -> None:
        assert self.base is not None
        for record in self._new_records():
            matched = self.base.match(record.settings)
            if matched is None or matched[1]:
                continue
            k = matched[0]
            # Promoting every tensor to float quantizes nothing: whether its metric met the
            # tolerance is what the bisection needs. An earlier phase's record was known
            # before the first round.
            given = int(record.phase or 0) != self.index
            self.bisection.record(
                k, meets_tolerance(record), extra_count(record, "ranked"), given=given
            )

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        if self.finished:
            return EXHAUSTED
        if self.base is None:
            if search.live_keys:
                return None  # the best of the phases before needs all their results
            if not self._init():
                return self._finish()
        self._absorb()
        assert self.base is not None
        live = search.live_keys
        pending = {k for k, key in self.keys.items() if key in live}
        step = self.bisection.next(pending)
        if step == DONE:
            return self._finish()
        if step is None:
            return None
        assert isinstance(step, int)
        settings = self.base.with_k(step)
        refusal = setting_refusal(settings, self.context)
        if refusal is not None:
            _logger.info("stage %s ends: top_k = %d cannot run (%s)", self._name, step, refusal)
            return self._finish()
        proposal = setting_proposal(settings, self.index)
        self.keys[step] = proposal.key
        if proposal.key in search.done:  # a record this phase has not matched: a failure
            self.bisection.record(step, False)
            return self.propose(trial_id, search)
        return proposal

    def _finish(self) -> str:
        self.finished = True
        self.found = self.bisection.found
        if self.base is not None:
            if self.found is None:
                _logger.info("fallback: promoting every ranked tensor misses the tolerance")
            else:
                _logger.info("fallback: top_k = %d is the smallest that holds", self.found)
        return EXHAUSTED


class RevertPhase(RecordReader, Phase):
    """Phase C: the ranks promoted by phase B's k returned to int8, one at a time in parallel,
    then those that held together (see the module)."""

    def __init__(self, fallback: FallbackPhase, index: int) -> None:
        self.fallback = fallback
        self.index = index
        self.k: int | None = None
        self.results: dict[frozenset[int], tuple[bool, float | None]] = {}
        #: The demoted ranks of the setting the pass settled on (None: none held).
        self.chosen: frozenset[int] | None = None
        self.finished = False

    def start(self, context: StrategyContext) -> None:
        self.context = context

    def _absorb(self) -> None:
        base = self.fallback.base
        assert base is not None
        for record in self._new_records():
            matched = base.match(record.settings)
            if matched is not None and matched[0] == self.k and matched[1]:
                self.results[matched[1]] = (is_candidate(record), record.metric)

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        if self.finished:
            return EXHAUSTED
        if self.k is None:
            k = self.fallback.found
            if k is None or k <= 1 or k > PER_RANK or self.fallback.base is None:
                self.finished = True
                return EXHAUSTED
            self.k = k
        self._absorb()
        singles = [frozenset({rank}) for rank in range(1, self.k + 1)]
        waiting = False
        for demoted in singles:
            proposal = self._proposal(demoted, search)
            if proposal == "wait":
                waiting = True
            elif proposal is not None:
                return proposal
        if waiting:
            return None
        held = frozenset(rank for s in singles if self.results[s][0] for rank in s)
        if len(held) >= 2:
            proposal = self._proposal(held, search)
            if proposal == "wait":
                return None
            if proposal is not None:
                return proposal
        return self._finish(singles, held)

    def _proposal(self, demoted: frozenset[int], search: SearchView) -> Proposal | str | None:
        """The proposal of ``demoted``; "wait" while it runs; None once its result is known."""
        if demoted in self.results:
            return None
        base = self.fallback.base
        assert base is not None and self.k is not None
        proposal = setting_proposal(base.with_k(self.k, sorted(demoted)), self.index)
        if proposal.key in search.live_keys:
            return "wait"
        if proposal.key in search.done:  # known, unmatched: it failed
            self.results[demoted] = (False, None)
            return None
        return proposal

    def _finish(self, singles: list[frozenset[int]], held: frozenset[int]) -> str:
        self.finished = True
        if len(held) >= 2 and self.results.get(held, (False, None))[0]:
            self.chosen = held
        else:
            good = [s for s in singles if self.results[s][0]]
            higher = self.context is not None and self.context.mode == "max"

            def score(s: frozenset[int]) -> float:
                metric = self.results[s][1]
                value = float(metric) if isinstance(metric, (int, float)) else float("nan")
                return value if higher else -value

            self.chosen = max(good, key=score) if good else None
        _logger.info(
            "revert: %s of the top %d back to int8",
            "none" if self.chosen is None else sorted(self.chosen),
            self.k,
        )
        return EXHAUSTED


def search_budget(max_trials: int | None) -> int:
    """Phase A's trials: half the iteration limit (at least 1), :data:`SEARCH_TRIALS` without.

    Example:
        >>> search_budget(20), search_budget(1), search_budget(None)
        (10, 1, 8)
    """
    if max_trials and max_trials > 0:
        return max(1, max_trials // 2)
    return SEARCH_TRIALS


@register_strategy("Fallback", aliases=("fallback", "mse_v2"))
def fallback_strategy(context: StrategyContext) -> list[Phase]:
    """Fallback: TPE over the spaces, bisection over mixed precision's top_k, revert pass."""
    search = sampler_strategy(
        "TPE", dataclasses.replace(context, max_trials=search_budget(context.max_trials))
    )
    fallback = FallbackPhase(len(search))
    return [*search, fallback, RevertPhase(fallback, len(search) + 1)]
