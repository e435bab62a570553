"""Search strategies: phases that propose settings, in a registry by ``search_algo`` name.

A search runs its strategy's *phases* in order: a :class:`Phase` proposes settings, learns
each finished record and says when it is exhausted; its :meth:`Phase.start` sees the
:class:`StrategyContext`. A strategy is a *builder*, ``(context) -> list[Phase]``, registered
with :func:`register_strategy`; the built-in ones are imported on first use.

Example:
    >>> canonical_strategy("grid_search"), canonical_strategy("tpe")
    ('Grid', 'TPE')
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from raysearch.errors import ConfigError, canonical_name, suggest
from raysearch.trialrecord import TrialRecord
from raysearch.usercode import note_plugin

if TYPE_CHECKING:
    from raysearch.space import SearchSpace
    from raysearch.space.space import Reject

__all__ = [
    "EXHAUSTED",
    "Proposal",
    "Phase",
    "SearchView",
    "ModelFacts",
    "StrategyContext",
    "Builder",
    "BUILTIN_STRATEGIES",
    "register_strategy",
    "get_strategy",
    "strategy_names",
    "canonical_strategy",
    "check_strategy_available",
    "check_strategy_spaces",
]

#: What :meth:`Phase.propose` returns when the phase has nothing more to propose.
EXHAUSTED = "__exhausted__"


@dataclass
class Proposal:
    """One setting a phase proposes; build it with :meth:`of`.

    Attributes:
        phase: the index of its space (``phase`` in the records).
        point: the sampled point (dotted key path -> value).
        params: what is recorded of it (validity rules applied).
        settings: the nested settings the trial runs.
        key: their identity: a setting runs at most once in a search.
        inner_id: the phase's own id for it (an Optuna trial's), or None.
        stage: the stage recorded for it when it is not its phase's (a check run beside a
            stage), or None.
        reusable: whether its result may be taken from an earlier search's trial of the same
            settings on the same model and data (the search's probe cache, keyed by content)
            instead of run again (``WeightOnly``'s sensitivity probes).
    """

    phase: int
    point: dict[str, Any]
    params: dict[str, Any]
    settings: dict[str, Any]
    key: str
    inner_id: str | None = None
    stage: str | None = None
    reusable: bool = False

    @classmethod
    def of(
        cls, space: SearchSpace, index: int, point: dict[str, Any], inner_id: str | None = None
    ) -> Proposal:
        """The proposal of a point of a space (the space's rules and settings applied).

        Args:
            space: the space the point is of.
            index: the space's index in ``StrategyContext.spaces``.
            point: the point: dotted key path -> value (``space.expand().points`` holds
                every one of a finite space).
            inner_id: the phase's own id for it, or None.

        Returns:
            The proposal.

        Example:
            >>> from raysearch.space import SearchSpace
            >>> space = SearchSpace.parse(
            ...     {"calibrate_method": ["Percentile"], "extra_options": {"Percentile": [99.9]}}
            ... )
            >>> point = space.expand().points[0]
            >>> point
            {'calibrate_method': 'Percentile', 'extra_options.CalibPercentile': 99.9}
            >>> Proposal.of(space, 0, point).settings
            {'calibrate_method': 'Percentile', 'extra_options': {'CalibPercentile': 99.9}}
        """
        from raysearch.space import settings_key

        params, _ = space.canonical(point)
        settings = space.to_settings(point)
        return cls(index, dict(point), params, settings, settings_key(settings), inner_id)


class SearchView(Protocol):
    """What a phase may read of the search (``propose``'s ``search``): the settings finished
    and running, by :attr:`Proposal.key`.

    Attributes:
        done: key -> metric (None: failed) of each finished setting.
        objectives: key -> what a sampler optimises for each finished setting (see
            :meth:`Phase.completed`).
        values: key -> the values of every one of ``StrategyContext.objectives`` for each
            finished setting (None: one is missing), kept only when there are several.
        live_keys: the keys of the settings running.
        known_keys: the keys finished or running.
    """

    done: dict[str, float | None]
    objectives: dict[str, float | None]
    values: dict[str, tuple[float, ...] | None]

    @property
    def live_keys(self) -> set[str]: ...

    @property
    def known_keys(self) -> set[str]: ...

    def knows(self, key: str) -> bool:
        """Whether ``key`` finished or runs (without building :attr:`known_keys`)."""
        ...


class Phase:
    """One step of a strategy. Subclasses implement :meth:`propose`; :meth:`start` and
    :meth:`completed` are optional. ``budget`` caps the trials this phase may start (None:
    until it is exhausted); the search then goes on to the next phase. A ``stage`` attribute
    (a string) is recorded with each of its trials.

    A phase that raises ends the search once the running trials finish.
    """

    budget: int | None = None

    def start(self, context: StrategyContext) -> None:  # noqa: B027 - optional hook
        """Called once, when the phase becomes current, before its first :meth:`propose`.

        Args:
            context: the search's context; ``context.records`` holds every trial finished so
                far, so a phase can build its proposals from earlier results.
        """

    def propose(self, trial_id: str, search: SearchView) -> Proposal | str | None:
        """The next setting to run.

        Args:
            trial_id: Ray Tune's id of the trial that would run it.
            search: what the search knows (a :class:`SearchView`): a phase skips a setting
                whose ``key`` it ``knows``, else the search asks again.

        Returns:
            A :class:`Proposal`; None to wait until a running trial finishes (the search asks
            again then); :data:`EXHAUSTED` when the phase has nothing more.
        """
        raise NotImplementedError

    def completed(  # noqa: B027 - optional hook
        self,
        proposal: Proposal,
        metric: float | None,
        error: bool,
        *,
        objective: float | None = None,
        values: tuple[float, ...] | None = None,
    ) -> None:
        """The trial of one of this phase's proposals finished.

        Args:
            proposal: what the phase proposed.
            metric: the trial's metric; None when it failed.
            error: whether it raised or crashed.
            objective: what a sampler should optimise: the metric, moved past every
                non-candidate by the quantized share for a candidate (see
                :meth:`raysearch.evaluate.Evaluator.sampler_objective`).
            values: with several ``StrategyContext.objectives``, each one's value
                (``objective`` in the metric's place; None when one is missing); the searcher
                passes it only then, so a phase written for one objective need not take it.
        """


@dataclass(frozen=True)
class ModelFacts:
    """What a strategy may need to know of the float model (``StrategyContext.model``).

    Attributes:
        node_names: its node names, in graph order.
        tensor_names: graph inputs, outputs and every node output.
        op_types: its op types, in order of first use.
        weight_matmuls: the MatMul nodes whose second input is a 2-D initializer (the weight
            MatMuls a weight-only quantizer rewrites).
        weight_shapes: each weight MatMul's weight shape, in that order.
    """

    node_names: tuple[str, ...] = ()
    tensor_names: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    weight_matmuls: tuple[str, ...] = ()
    weight_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def weights(self) -> dict[str, tuple[int, ...]]:
        """Each weight MatMul's weight shape, by node name (what a backend's
        ``reject_on_model`` reads)."""
        return dict(zip(self.weight_matmuls, self.weight_shapes))

    @classmethod
    def of(cls, model: Any) -> ModelFacts:
        """The facts of an ``onnx.ModelProto`` or a model path (external data not loaded)."""
        import onnx

        from raysearch.modelfile import load_header

        if not isinstance(model, onnx.ModelProto):
            model = load_header(model)
        graph = model.graph
        tensors = [i.name for i in graph.input] + [o for n in graph.node for o in n.output]
        tensors += [o.name for o in graph.output]
        matrices = {t.name: tuple(t.dims) for t in graph.initializer if len(t.dims) == 2}
        weighted = [
            n
            for n in graph.node
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in matrices
        ]
        return cls(
            tuple(n.name for n in graph.node),
            tuple(dict.fromkeys(t for t in tensors if t)),
            tuple(dict.fromkeys(n.op_type for n in graph.node)),
            tuple(n.name for n in weighted),
            tuple(matrices[n.input[1]] for n in weighted),
        )


@dataclass
class StrategyContext:
    """Everything a strategy's builder and its phases get.

    Attributes:
        spaces: the config's search spaces, in order.
        mode: ``min`` or ``max`` of ``metric``.
        seed: the config's ``seed`` (None: none).
        reject: the backends' and techniques' refusal check of a setting (pass it to
            ``expand_spaces``).
        max_trials: ``stop.iteration_limit`` (None: no limit).
        model: the float model's :class:`ModelFacts`.
        records: every finished trial's :class:`~raysearch.trialrecord.TrialRecord` so far,
            in the order they finished, kept up to date by the search.
        concurrent: how many trials run at once.
        objectives: the config's ``objectives``; with several, a strategy whose
            ``StrategyInfo.multi_objective`` is set samples on each.
        sampler: an Optuna sampler given from Python as ``search_algo``, else None.
        sampler_options: the config's ``sampler_options``.
        size_budget_bytes: the largest model a candidate may be (``size_budget``), or None.
    """

    spaces: Sequence[SearchSpace]
    mode: str = "min"
    seed: int | None = None
    reject: Reject | None = None
    max_trials: int | None = None
    model: ModelFacts = field(default_factory=ModelFacts)
    records: list[TrialRecord] = field(default_factory=list)
    concurrent: int = 1
    objectives: tuple[str, ...] = ("metric",)
    sampler: Any = None
    sampler_options: Mapping[str, Any] = field(default_factory=dict)
    size_budget_bytes: int | None = None

    def best(self) -> TrialRecord | None:
        """The best finished record so far by :func:`raysearch.ranking.better`.

        Returns:
            The record, or None when no record has a metric.
        """
        from raysearch.ranking import best_record

        return best_record(self.records, self.mode == "max")


#: A strategy: the phases of a search, built from its context.
Builder = Callable[[StrategyContext], Sequence[Phase]]


@dataclass(frozen=True)
class StrategyInfo:
    """A built-in strategy: its module, aliases and the packages it needs (import names)."""

    module: str
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    #: The module's ``check_spaces(spaces)`` refuses spaces it cannot search.
    checks_spaces: bool = False
    #: Its samplers optimise every one of the config's ``objectives``.
    multi_objective: bool = False


#: Strategies shipped with raysearch: ``search_algo`` name -> where it is registered; the
#: aliases include Neural Compressor's and Quark's names.
BUILTIN_STRATEGIES: dict[str, StrategyInfo] = {
    "Auto": StrategyInfo("raysearch.strategies._auto", ("auto", "basic")),
    "Grid": StrategyInfo(
        "raysearch.strategies.grid", ("grid", "grid_search", "gridsearch", "exhaustive")
    ),
    "Random": StrategyInfo(
        "raysearch.strategies.samplers", ("random", "random_search"), multi_objective=True
    ),
    "TPE": StrategyInfo("raysearch.strategies.samplers", ("tpe",), multi_objective=True),
    "CmaEs": StrategyInfo(
        "raysearch.strategies.samplers", ("cmaes", "cma-es", "cma_es"), ("cmaes",)
    ),
    "GPS": StrategyInfo(
        "raysearch.strategies.samplers",
        ("gps", "gp", "bayesian"),
        ("torch", "scipy"),
        multi_objective=True,
    ),
    "NSGAII": StrategyInfo(
        "raysearch.strategies.samplers", ("nsgaii", "nsga2", "nsga-ii"), multi_objective=True
    ),
    "QMC": StrategyInfo(
        "raysearch.strategies.samplers", ("qmc",), ("scipy",), multi_objective=True
    ),
    "Fallback": StrategyInfo("raysearch.strategies._fallback", ("fallback", "mse_v2", "mse")),
    "Conservative": StrategyInfo("raysearch.strategies._conservative", ("conservative",)),
    "TwoStage": StrategyInfo(
        "raysearch.strategies._two_stage", ("two_stage", "two_stage_search", "twostage")
    ),
    "FinetuneSearch": StrategyInfo(
        "raysearch.strategies._finetune_search",
        ("finetune_search", "advanced_fastft_search", "fastft_search"),
        checks_spaces=True,
    ),
    "WeightOnly": StrategyInfo("raysearch.strategies._weight_only", ("weight_only",)),
}

#: Names of the systems raysearch replaces that have no raysearch meaning: name -> why.
REFUSED_STRATEGIES: dict[str, str] = {
    "hawq_v2": "Neural Compressor's hawq_v2 ranks layers by the Hessian of the model's "
    "training loss, which a post-training search of an ONNX model does not have; use Auto "
    "or Fallback (sensitivity-ranked mixed precision)",
}

_logger = logging.getLogger(__name__)
_REGISTRY: dict[str, Builder] = {}
_UNLISTED: set[str] = set()
_ALIASES: dict[str, str] = {
    alias: name for name, info in BUILTIN_STRATEGIES.items() for alias in info.aliases
}


def register_strategy(
    name: str, *, aliases: Sequence[str] = (), listed: bool = True
) -> Callable[[Builder], Builder]:
    """Decorator registering a strategy builder under the ``search_algo`` name ``name``,
    its module recorded for the trial actors to import.

    Args:
        name: the ``search_algo`` name.
        aliases: other spellings a config may use.
        listed: False for a name no config spells (the strategy of an Optuna sampler given
            from Python), left out of :func:`strategy_names`.

    Returns:
        The decorator, which returns the builder registered.

    Raises:
        TypeError: the decorated object is not callable.

    Example:
        >>> register_strategy("Mine")("not a builder")
        Traceback (most recent call last):
        ...
        TypeError: @register_strategy('Mine') needs a callable builder
    """

    def decorate(builder: Builder) -> Builder:
        if not callable(builder):
            raise TypeError(f"@register_strategy({name!r}) needs a callable builder")
        _REGISTRY[name] = builder
        if not listed:
            _UNLISTED.add(name)
        note_plugin(getattr(builder, "__module__", "") or "")
        for alias in aliases:
            _ALIASES[alias] = name
        return builder

    return decorate


def strategy_names() -> list[str]:
    """Every strategy name: the built-in ones and any registered since."""
    return [n for n in dict.fromkeys([*BUILTIN_STRATEGIES, *_REGISTRY]) if n not in _UNLISTED]


def canonical_strategy(value: Any, key: str = "search_algo") -> str:
    """The registered name ``value`` spells (itself or an alias, in any case), or
    ConfigError naming ``key`` with the closest name."""
    names = strategy_names()
    if isinstance(value, str) and value.strip().lower() in REFUSED_STRATEGIES:
        raise ConfigError(key, REFUSED_STRATEGIES[value.strip().lower()])
    mapped = canonical_name(value, names, _ALIASES)
    if mapped == value:
        return mapped
    if mapped is not None:
        _logger.info("config: %s '%s' read as '%s'", key, value, mapped)
        return mapped
    raise ConfigError(
        key,
        f"expected one of {', '.join(names)}, got {value!r}"
        + (suggest(value, [*names, *_ALIASES]) if isinstance(value, str) else ""),
    )


def check_strategy_available(name: str) -> None:
    """ConfigError when a built-in strategy needs a package that is not installed."""
    info = BUILTIN_STRATEGIES.get(name)
    missing = [m for m in (info.requires if info else ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            "search_algo",
            f"{name} needs the package(s) {', '.join(missing)}, which are not installed "
            f"(pip install {' '.join(missing)}); or choose TPE, Random, NSGAII or Grid",
        )


def get_strategy(name: str) -> Builder:
    """The builder registered as ``name`` (importing a built-in one's module on first use)."""
    if name in _UNLISTED:
        return _REGISTRY[name]
    name = canonical_strategy(name)
    if name not in _REGISTRY and name in BUILTIN_STRATEGIES:
        check_strategy_available(name)
        importlib.import_module(BUILTIN_STRATEGIES[name].module)
    if name not in _REGISTRY:  # a built-in module that failed to register it: a bug
        raise ConfigError("search_algo", f"strategy '{name}' did not register itself")
    return _REGISTRY[name]


def check_strategy_spaces(name: str, spaces: Sequence[SearchSpace]) -> None:
    """ConfigError when the built-in strategy ``name`` cannot search ``spaces``."""
    info = BUILTIN_STRATEGIES.get(name)
    if info is not None and info.checks_spaces:
        importlib.import_module(info.module).check_spaces(spaces)
