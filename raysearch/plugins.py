"""The plugin API: a quantizer backend, a technique or a search strategy written outside raysearch.

What :data:`__all__` lists is public and stable. A plugin module registers its classes when
imported; a config names it (``plugins: [my_backend]``) and the search imports it in the
driver and every trial actor. README, "Plugins", has one of each.

Example:
    A phase driven by hand, as the search drives it:

    >>> from raysearch import SearchSpace
    >>> class EveryOther(Phase):
    ...     def start(self, context):
    ...         grid = expand_spaces(context.spaces, context.reject)
    ...         self.todo = list(zip(grid.space_index, grid.points))[::2]
    ...         self.spaces = context.spaces
    ...     def propose(self, trial_id, search):
    ...         if not self.todo:
    ...             return EXHAUSTED
    ...         index, point = self.todo.pop(0)
    ...         return Proposal.of(self.spaces[index], index, point)
    >>> space = SearchSpace.parse({"calibrate_method": ["MinMax", "Entropy", "Percentile"]})
    >>> phase = EveryOther()
    >>> phase.start(StrategyContext([space]))
    >>> [phase.propose(str(i), None) for i in range(3)][-1]
    '__exhausted__'
    >>> phase.start(StrategyContext([space]))
    >>> phase.propose("0", None).settings
    {'calibrate_method': 'MinMax'}

    A technique's settings and effect, without a trial:

    >>> class KeepLastFloat(TensorOverrideProducer):
    ...     settings = {"include_keep_last_float": OptionSpec("bool", "last MatMul in float")}
    ...     def effect_key(self, settings):
    ...         return "on" if settings.get("include_keep_last_float") else None
    ...     def overrides(self, model_path, settings):
    ...         return TensorOverrides(nodes_to_exclude=["fc2"])
    >>> technique = KeepLastFloat()
    >>> technique.effect_key({"include_keep_last_float": True}), technique.kind
    ('on', 'tensor_overrides')
"""

from __future__ import annotations

from raysearch.quantize.registry import QuantizeInfo, QuantizerBackend, register_backend
from raysearch.quantize.technique import (
    FloatModelTransform,
    QuantizedModelTransform,
    Technique,
    TechniqueContext,
    TensorOverrideProducer,
    TensorOverrides,
    register_technique,
)
from raysearch.space import expand_spaces
from raysearch.space.catalogue import QUANTIZER, Catalogue, OptionSpec
from raysearch.strategies import (
    EXHAUSTED,
    ModelFacts,
    Phase,
    Proposal,
    SearchView,
    StrategyContext,
    register_strategy,
)

__all__ = [
    # backends
    "QuantizerBackend",
    "QuantizeInfo",
    "Catalogue",
    "OptionSpec",
    "QUANTIZER",
    "register_backend",
    # techniques
    "Technique",
    "FloatModelTransform",
    "TensorOverrideProducer",
    "QuantizedModelTransform",
    "TensorOverrides",
    "TechniqueContext",
    "register_technique",
    # strategies
    "Phase",
    "Proposal",
    "SearchView",
    "StrategyContext",
    "ModelFacts",
    "EXHAUSTED",
    "expand_spaces",
    "register_strategy",
]
