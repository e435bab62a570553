"""The ``Auto`` strategy (aliases ``auto``, ``basic``): the space searched stage by stage,
cheapest first, as AIMET's AutoQuant orders its techniques and Neural Compressor's ``basic``
falls back op by op:

1. ``defaults``: each space's ``points_to_evaluate``, or its first setting.
2. ``calibration``: the calibration settings with every technique off: the sub-grid, or TPE.
3. ``techniques``: each cheap technique on its own on the :data:`TOP_K` best settings so far,
   then ``combined``, those that each beat their base, together; beside them (``reachability``)
   the 16-bit reachability checks. Skipped once a candidate quantizes every MatMul/Gemm/Conv.
4. ``mixed_precision``: the smallest ``top_k`` promoted to int16 that meets the tolerance (by
   bisection, :mod:`raysearch.strategies._fallback`), then ``mixed_precision_weights`` with
   the promoted nodes' weights at 16 bits too.
5. ``fine_tuning``: AdaQuant/AdaRound on the :data:`TOP_K` best, while no candidate quantizes
   every MatMul/Gemm/Conv; then ``fine_tuned_mixed_precision``.
6. ``float_fallback``: only while there is no candidate: the smallest ``top_k`` kept float.

Every stage builds its settings from the finished records, so a resume goes on with nothing
rerun; the log says why each stage starts, what it runs, and why it ends.

Example:
    >>> calibration_budget(30), calibration_budget(None), calibration_budget(4)
    (12, 24, 2)
    >>> calibration_budget(30, later_stages=False)
    30
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from raysearch.quantize.techniques.mixed_precision import KEY
from raysearch.ranking import best_record, best_records, better, is_candidate, order
from raysearch.space import Categorical, SearchSpace
from raysearch.strategies._fallback import ALL, Base, FallbackPhase
from raysearch.strategies._registry import Phase, Proposal, StrategyContext, register_strategy
from raysearch.strategies._roles import (
    FINETUNE,
    TECHNIQUE,
    complete_point,
    merge_settings,
    role_deltas,
)
from raysearch.strategies._setting_phase import extra_count, records_before, setting_refusal
from raysearch.strategies._stages import (
    BuiltPhase,
    DeferredPhase,
    ListPhase,
    calibration_phases,
    distinct_accepted,
)
from raysearch.trialrecord import TrialRecord

__all__ = ["fully_quantized_candidate"]

_logger = logging.getLogger(__name__)

#: How many of the best settings so far the techniques and fine-tuning stages build on.
TOP_K = 2
#: The calibration stage's trials without an iteration limit.
CALIBRATION_TRIALS = 24
#: The stage recorded for the 16-bit reachability checks run beside the techniques.
REACHABILITY = "reachability"
#: A quantized share at least this high quantizes every MatMul/Gemm/Conv (float rounding).
_FULL_SHARE = 0.999


def calibration_budget(max_trials: int | None, later_stages: bool = True) -> int:
    """The calibration stage's trials: two fifths of the iteration limit (at least 2), or
    :data:`CALIBRATION_TRIALS` without one; the whole limit when no stage follows."""
    if max_trials and max_trials > 0:
        return max_trials if not later_stages else max(2, (2 * max_trials) // 5)
    return CALIBRATION_TRIALS


def fully_quantized_candidate(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The first candidate that quantizes every MatMul/Gemm/Conv, or None."""
    for record in order(records):
        if not is_candidate(record):
            continue
        share = record.extra.get("quantized_share")
        if share is None or float(share) >= _FULL_SHARE:
            return record
    return None


def _fully_quantized_found(records: Sequence[TrialRecord], what: str) -> bool:
    """Whether a candidate of ``records`` quantizes every MatMul/Gemm/Conv (then ``what`` is
    skipped, logged)."""
    found = fully_quantized_candidate(records)
    if found is not None:
        _logger.info(
            "%s skipped: trial %s (metric %s) meets the tolerance with every MatMul/Gemm/Conv "
            "quantized",
            what,
            found.trial_id,
            found.metric,
        )
    return found is not None


def _higher(context: StrategyContext) -> bool:
    return context.mode == "max"


def _ok(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.ok and r.settings]


class DefaultsPhase(DeferredPhase):
    """Stage 1: each space's start points (completed), or its first setting."""

    stage = "defaults"

    def __init__(self, spaces: Sequence[SearchSpace], index: int) -> None:
        super().__init__(index)
        self.spaces = list(spaces)

    def make(self, context: StrategyContext) -> Phase | None:
        proposals = [
            Proposal.of(space, i, complete_point(space, point))
            for i, space in enumerate(self.spaces)
            for point in space.points_to_evaluate or [{}]
        ]
        proposals = distinct_accepted(proposals, context.reject, self.stage)
        _logger.info(
            "stage defaults: %d start setting(s) (the spaces' points_to_evaluate, or their "
            "first setting)",
            len(proposals),
        )
        return ListPhase(proposals, self.stage)


class TechniquesPhase(BuiltPhase):
    """Stage 3: each cheap technique of the spaces on its own, on the best settings so far;
    beside them (stage ``reachability``), the 16-bit reachability checks on the best."""

    stage = "techniques"

    def __init__(
        self,
        deltas: list[dict[str, Any]],
        index: int,
        checks: Sequence[bool] = (),
        rank_by: str = "sqnr",
    ) -> None:
        super().__init__(index)
        self.deltas = deltas
        #: ``promote_weights`` of each reachability check (none: the space promotes nothing).
        self.checks = list(checks)
        self.rank_by = rank_by
        #: base key -> its settings, chosen when the stage was built.
        self.bases: list[dict[str, Any]] = []

    def make(self, context: StrategyContext) -> Phase | None:
        earlier = _ok(records_before(context.records, self.index))
        bases = best_records(earlier, TOP_K, _higher(context))
        if not bases:
            _logger.info("stage techniques skipped: no setting finished")
            return None
        self.bases = [dict(b.settings) for b in bases]
        checks = [replace(p, stage=REACHABILITY) for p in self.proposals(self._checks(earlier))]
        settings = [merge_settings(base, d) for base in self.bases for d in self.deltas]
        proposals = checks + [p for p in self.proposals(settings) if p.key not in _keys(checks)]
        if not proposals:
            _logger.info("stage techniques skipped: the spaces switch no technique on")
            return None
        _logger.info(
            "stage techniques starts: %d reachability check(s) and %d technique setting(s) on "
            "the %d best so far (%s)",
            len(checks),
            len(proposals) - len(checks),
            len(bases),
            ", ".join(f"trial {b.trial_id} metric {b.metric}" for b in bases),
        )
        return ListPhase(proposals, self.stage)

    def _checks(self, earlier: Sequence[TrialRecord]) -> list[dict[str, Any]]:
        """The reachability checks' settings, run beside the techniques so that where only
        16-bit promotions reach the tolerance the first candidate comes a stage earlier."""
        if not self.checks:
            return []
        if _fully_quantized_found(earlier, "reachability checks"):
            return []

        def checks(record: TrialRecord) -> list[dict[str, Any]]:
            settings = {k: v for k, v in record.settings.items() if k != KEY}
            return [
                Base(settings, "int16", self.rank_by, weights).with_k(ALL)
                for weights in self.checks
            ]

        # Only a base that can promote tensors (not a dynamic-quantization setting).
        usable = [r for r in earlier if setting_refusal(checks(r)[0], self.context) is None]
        best = best_unpromoted(usable, self.context is None or self.context.mode == "max")
        if best is None:
            _logger.info("reachability checks skipped: no finished setting can promote tensors")
            return []
        return checks(best)


def _keys(proposals: Sequence[Proposal]) -> set[str]:
    return {p.key for p in proposals}


def _promotes(record: TrialRecord) -> bool:
    """Whether a record's setting promotes tensors (mixed precision's ``top_k`` above 0)."""
    options = (record.settings or {}).get(KEY)
    return bool(isinstance(options, Mapping) and options.get("top_k")) or bool(
        extra_count(record, "promoted")
    )


def best_unpromoted(records: Sequence[TrialRecord], higher: bool) -> TrialRecord | None:
    """The best record that promotes no tensor (the best of all when every one does)."""
    plain = [r for r in records if not _promotes(r)]
    return best_record(plain or list(records), higher)


class MixedPrecisionPhase(FallbackPhase):
    """Stage 4 (``mixed_precision``, ``mixed_precision_weights``): the bisection from the best
    setting that promotes nothing; the weights stage is skipped only by a candidate whose
    weights all stay 8-bit."""

    def _best(self, earlier: Sequence[TrialRecord]) -> TrialRecord | None:
        assert self.context is not None
        return best_unpromoted(earlier, _higher(self.context))

    def _blocks(self, record: TrialRecord) -> bool:
        options = (record.settings or {}).get(KEY)
        weights = isinstance(options, Mapping) and bool(options.get("promote_weights"))
        return is_candidate(record) and not (self.promote_weights and weights)


class CombinedPhase(BuiltPhase):
    """Stage 3b: on each base of :class:`TechniquesPhase`, the techniques that each beat the
    base (the best of each technique's settings), all together."""

    stage = "combined"

    def __init__(self, techniques: TechniquesPhase, index: int) -> None:
        super().__init__(index)
        self.techniques = techniques

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        by_key = {r.key: r for r in _ok(context.records)}
        higher = _higher(context)
        out: list[dict[str, Any]] = []
        for base in self.techniques.bases:
            base_record = by_key.get(_key(base))
            helping: dict[str, tuple[TrialRecord, dict[str, Any]]] = {}
            for delta in self.techniques.deltas:
                record = by_key.get(_key(merge_settings(base, delta)))
                if record is None or base_record is None or not _beats(record, base_record, higher):
                    continue
                switch = next(iter(delta))
                if switch not in helping or better(record, helping[switch][0], higher):
                    helping[switch] = (record, delta)
            if len(helping) >= 2:
                out.append(merge_settings(base, *(d for _, d in helping.values())))
        if not out:
            _logger.info("stage combined skipped: no two techniques each beat their base")
            return None
        return out


def _key(settings: Mapping[str, Any]) -> str:
    from raysearch.space import settings_key

    return settings_key(dict(settings))


def _beats(record: TrialRecord, base: TrialRecord, higher: bool) -> bool:
    """Whether a technique's trial improved on its base (as :func:`better` ranks it)."""
    metric, base_metric = record.metric, base.metric
    if not isinstance(metric, (int, float)) or not isinstance(base_metric, (int, float)):
        return False
    if is_candidate(record) != is_candidate(base):
        return is_candidate(record)
    return metric > base_metric if higher else metric < base_metric


class FinetunePhase(BuiltPhase):
    """Stage 5: the spaces' fine-tuning settings on the best settings so far, while no
    candidate quantizes every MatMul/Gemm/Conv."""

    stage = "fine_tuning"

    def __init__(
        self, deltas: list[dict[str, Any]], index: int, mixed: Sequence[FallbackPhase] = ()
    ):
        super().__init__(index)
        self.deltas = deltas
        #: The 16-bit stages, whose first trials are the reachability checks.
        self.mixed = list(mixed)

    def build(self, context: StrategyContext) -> list[dict[str, Any]] | None:
        self._say_reachability(context)
        if not self.deltas:
            _logger.info("stage fine_tuning skipped: the spaces do not fine-tune")
            return None
        earlier = records_before(context.records, self.index)
        if _fully_quantized_found(earlier, "stage fine_tuning"):
            return None
        records = [r for r in _ok(earlier) if not r.settings.get("include_fast_ft")]
        # Only bases that can fine-tune (not a dynamic-quantization setting: no QDQ graph).
        tunable = [r for r in records if self._tunable(r.settings, context)]
        bases = best_records(tunable, TOP_K, _higher(context))
        if not bases:
            why = self._refusal(order(records)[0].settings, context) if records else None
            _logger.info(
                "stage fine_tuning skipped: none of the %d finished settings can be fine-tuned%s",
                len(records),
                f" ({why})" if why else "",
            )
            return None
        _logger.info(
            "stage fine_tuning starts: no candidate quantizes every MatMul/Gemm/Conv; "
            "%d fine-tuning setting(s) on the %d best so far",
            len(self.deltas),
            len(bases),
        )
        return [merge_settings(dict(b.settings), d) for b in bases for d in self.deltas]

    def _refusal(self, settings: Mapping[str, Any], context: StrategyContext) -> str | None:
        """Why no fine-tuning setting can run on ``settings``, None when one can."""
        reasons = [setting_refusal(merge_settings(dict(settings), d), context) for d in self.deltas]
        return None if None in reasons else reasons[0]

    def _tunable(self, settings: Mapping[str, Any], context: StrategyContext) -> bool:
        return self._refusal(settings, context) is None

    def _say_reachability(self, context: StrategyContext) -> None:
        """The reachability checks' verdicts, in words."""
        for mixed in self.mixed:
            base = mixed.base
            if base is None:
                continue
            for record in context.records:
                matched = base.match(record.settings)
                if matched is None or matched[0] < ALL or matched[1] or is_candidate(record):
                    continue
                what = "and its node's weight " if base.promote_weights else ""
                rest = (
                    "fine-tuning the weights or keeping tensors float is what is left"
                    if base.promote_weights
                    else "the 8-bit weights lose the rest"
                )
                _logger.warning(
                    "reachability: with every ranked activation tensor %sat 16 bits the metric "
                    "is %s (%d tensors), which misses the tolerance: %s",
                    what,
                    record.metric,
                    extra_count(record, "ranked") or 0,
                    rest,
                )


class TunedMixedPhase(FallbackPhase):
    """Stage 5b: when the best so far is a fine-tuned candidate with tensors promoted, the
    fewest int16 promotions that still hold with fine-tuning."""

    def _init(self) -> bool:
        assert self.context is not None
        from raysearch.ranking import best_record

        earlier = records_before(self.context.records, self.index)
        best = best_record(earlier, _higher(self.context))
        if (
            best is None
            or not (best.settings or {}).get("include_fast_ft")
            or not is_candidate(best)
        ):
            _logger.info("stage fine_tuned_mixed_precision skipped: no fine-tuned candidate")
            return False
        return super()._init()


def _promotions(spaces: Sequence[SearchSpace]) -> tuple[list[str], str]:
    """The promotions the spaces' mixed precision offers (``int16`` before ``float``, and
    ``int16_weights`` unless every space holds ``promote_weights`` at false) and its ranking."""
    offered: set[str] = set()
    rank_by = "sqnr"
    weights = False
    for space in spaces:
        params = {p.name: p.domain for p in space.params}
        top_k = params.get(f"{KEY}.top_k")
        if not isinstance(top_k, Categorical) or not any(k for k in top_k.choices):
            continue
        promote = params.get(f"{KEY}.promote_to")
        offered |= set(promote.choices) if isinstance(promote, Categorical) else {"float"}
        rank = params.get(f"{KEY}.rank_by")
        if isinstance(rank, Categorical):
            rank_by = str(rank.choices[0])
        held = params.get(f"{KEY}.promote_weights")
        weights |= not isinstance(held, Categorical) or any(held.choices)
    if weights and "int16" in offered:
        offered.add("int16_weights")
    return [p for p in ("int16", "int16_weights", "float") if p in offered], rank_by


@register_strategy("Auto", aliases=("auto", "basic"))
def auto_strategy(context: StrategyContext) -> list[Phase]:
    """Auto: defaults, calibration, techniques, mixed precision, fine-tuning, float fallback."""
    spaces = context.spaces
    n = len(spaces)
    technique_deltas: list[dict[str, Any]] = []
    finetune_deltas: list[dict[str, Any]] = []
    for space in spaces:
        for delta in role_deltas(space, TECHNIQUE, context.reject):
            if KEY not in delta and delta not in technique_deltas:
                technique_deltas.append(delta)
        for delta in role_deltas(space, FINETUNE, context.reject):
            if delta not in finetune_deltas:
                finetune_deltas.append(delta)
    promotions, rank_by = _promotions(spaces)
    phases: list[Phase] = [DefaultsPhase(spaces, 0)]
    later = bool(technique_deltas or finetune_deltas or promotions)
    phases += calibration_phases(context, calibration_budget(context.max_trials, later))
    checks = [False] * ("int16" in promotions) + [True] * ("int16_weights" in promotions)
    techniques = TechniquesPhase(technique_deltas, n, checks, rank_by)
    phases += [techniques, CombinedPhase(techniques, n + 1)]
    mixed: list[FallbackPhase] = []
    if "int16" in promotions:
        mixed.append(MixedPrecisionPhase(n + 2, "int16", rank_by, force=True))
        mixed[-1].stage = "mixed_precision"  # type: ignore[attr-defined]
    if "int16_weights" in promotions:
        mixed.append(
            MixedPrecisionPhase(
                n + 3,
                "int16",
                rank_by,
                force=True,
                only_without_candidate=True,
                promote_weights=True,
            )
        )
        mixed[-1].stage = "mixed_precision_weights"  # type: ignore[attr-defined]
    phases += mixed
    phases.append(FinetunePhase(finetune_deltas, n + 4, mixed))
    if "int16" in promotions and finetune_deltas:
        tuned = TunedMixedPhase(n + 5, "int16", rank_by, force=True)
        tuned.stage = "fine_tuned_mixed_precision"  # type: ignore[attr-defined]
        phases.append(tuned)
    if "float" in promotions:
        fallback = FallbackPhase(n + 6, "float", rank_by, force=True, only_without_candidate=True)
        fallback.stage = "float_fallback"  # type: ignore[attr-defined]
        phases.append(fallback)
    _logger.info(
        "auto: stages defaults, calibration, techniques (%d), mixed precision (%s), "
        "fine-tuning (%d), float fallback (%s)",
        len(technique_deltas),
        " then ".join(p for p in promotions if p != "float") or "not in the space",
        len(finetune_deltas),
        "yes" if "float" in promotions else "not in the space",
    )
    return phases
