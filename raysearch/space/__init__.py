"""Search spaces: both dialects, validity rules, grid expansion and define-by-run sampling."""

from raysearch.space.rules import RULES
from raysearch.space.space import Expansion, SearchSpace, expand_spaces, settings_key
from raysearch.space.tree import Categorical, Condition, FloatRange, Group, IntRange, Param

__all__ = [
    "SearchSpace",
    "Expansion",
    "expand_spaces",
    "settings_key",
    "RULES",
    "Group",
    "Param",
    "Condition",
    "Categorical",
    "IntRange",
    "FloatRange",
]
