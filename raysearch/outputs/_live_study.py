"""A search's Optuna study written as it runs (config ``optuna_storage``), for
``optuna-dashboard`` to show the search live.

It is the study ``raysearch export`` writes, but for two things: trials are numbered in the
order they ended, and a parameter's distribution is the search space's (a parameter no space
declares takes its first trial's; a value it cannot hold goes to the user attribute
``params/<name>``). A resumed search adds the journal's trials the study lacks, never one
twice (told apart by their ``trial_id`` attribute).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from raysearch.outputs._study import _value, describe_study, open_storage, study_trial
from raysearch.outputs._study_values import study_directions
from raysearch.trialrecord import TrialRecord

__all__ = ["LiveStudy"]

_logger = logging.getLogger("raysearch.outputs")


def space_distributions(spaces: Iterable[Any]) -> dict[str, Any]:
    """Each searched parameter's Optuna distribution by name: a choice's values (several
    spaces' together), a range's bounds; a name two spaces give different kinds is left out."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from raysearch.space.tree import Categorical, FloatRange, IntRange

    choices: dict[str, list[Any]] = {}
    ranges: dict[str, Any] = {}
    clash: set[str] = set()
    for space in spaces:
        for param in space.params:
            domain, name = param.domain, param.name
            if isinstance(domain, Categorical):
                values = choices.setdefault(name, [])
                values.extend(v for v in map(_value, domain.choices) if v not in values)
            elif isinstance(domain, IntRange):
                ranges[name] = IntDistribution(domain.low, domain.high, log=domain.log)
            elif isinstance(domain, FloatRange):
                ranges[name] = FloatDistribution(domain.low, domain.high, log=domain.log)
            if name in choices and name in ranges:
                clash.add(name)
    out: dict[str, Any] = {n: CategoricalDistribution(v) for n, v in choices.items()}
    out.update(ranges)
    return {n: d for n, d in out.items() if n not in clash}


class LiveStudy:
    """The Optuna study ``study_name`` in ``storage_url`` that a search writes each trial
    into; ``summary``: what is known of the search when it starts; ``spaces``: its search
    spaces (the parameters' distributions)."""

    def __init__(
        self,
        storage_url: str,
        study_name: str,
        summary: Mapping[str, Any],
        spaces: Iterable[Any] = (),
    ) -> None:
        self.storage_url = storage_url
        self.study_name = study_name
        self.summary = dict(summary)
        self.higher = bool(summary.get("higher_is_better"))
        self.objectives = tuple(summary.get("objectives") or ("metric",))
        self.study: Any = None
        #: Each parameter's distribution in the study (the space's; else its first trial's).
        self._dists: dict[str, Any] = space_distributions(spaces)
        #: The ``trial_id`` of each trial in the study.
        self._ids: set[str] = set()

    def open(self, records: Iterable[TrialRecord] = ()) -> None:
        """Create the study, or open the one a previous session of the search wrote, and add
        the ``records`` (the journal's) it does not hold yet, in start order.

        Raises:
            InputError: Optuna cannot open the storage.
        """
        import optuna

        from raysearch.ranking import order

        storage, _ = open_storage(self.storage_url)
        self.study = optuna.create_study(
            storage=storage,
            study_name=self.study_name,
            directions=study_directions(self.higher, self.objectives),
            load_if_exists=True,
        )
        for trial in self.study.get_trials(deepcopy=False):
            self._ids.add(str(trial.user_attrs.get("trial_id")))
            for name, dist in trial.distributions.items():
                self._dists.setdefault(name, dist)  # the study's, from its first trial on
        describe_study(self.study, {**self.summary, "stop_reason": None})
        for record in order(list(records)):
            self.add(record)

    def add(self, record: TrialRecord) -> None:
        """Write ``record``'s trial into the study (once: a trial already there is skipped)."""
        trial_id = str(record.trial_id)
        if self.study is None or trial_id in self._ids:
            return
        params, distributions, outside = {}, {}, {}
        for name, raw in (record.params or {}).items():
            value = _value(raw)
            dist = self._distribution(name, value)
            if dist is None:
                outside[f"params/{name}"] = value
            else:
                params[name], distributions[name] = value, dist
        trial = study_trial(
            record.replace(params=params), distributions, self.higher, self.objectives
        )
        trial.user_attrs.update(outside)
        self.study.add_trial(trial)
        self._ids.add(trial_id)

    def _distribution(self, name: str, value: Any) -> Any:
        """The distribution ``value`` of parameter ``name`` goes into the study with, None when
        the study's distribution of it cannot hold it."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        dist = self._dists.get(name)
        if dist is None:
            if number and isinstance(value, int):
                dist = IntDistribution(value, value)
            elif number:
                dist = FloatDistribution(float(value), float(value))
            else:
                dist = CategoricalDistribution([value])
            self._dists[name] = dist
            return dist
        if isinstance(dist, CategoricalDistribution):
            return dist if value in dist.choices else None
        if not number or (isinstance(dist, IntDistribution) and not isinstance(value, int)):
            return None
        if dist.low <= value <= dist.high:
            return dist
        # Optuna keeps a range's kind across a study's trials, not its bounds: this trial's
        # range holds its value (a log range stays above 0).
        if dist.log and value <= 0:
            return None
        low, high = min(dist.low, value), max(dist.high, value)
        return type(dist)(low, high, log=dist.log)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """The study's attributes from the search's final ``summary`` (its ``stop_reason``,
        the float model's metric)."""
        if self.study is not None:
            describe_study(self.study, summary)
