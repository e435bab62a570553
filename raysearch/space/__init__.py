"""Search spaces: both dialects, settings catalogues, validity rules, grid expansion and
define-by-run sampling. Pure data: the package imports no backend; backends register their
catalogues (:func:`register_catalogue`) when imported."""

from raysearch.space.catalogue import (
    Catalogue,
    OptionSpec,
    get_catalogue,
    register_catalogue,
    register_shared_settings,
    registered_catalogues,
)
from raysearch.space.points import fixed_space
from raysearch.space.rules import RULES
from raysearch.space.space import Expansion, SearchSpace, expand_spaces, settings_key
from raysearch.space.tree import Categorical, Condition, FloatRange, Group, IntRange, Param

__all__ = [
    "SearchSpace",
    "Expansion",
    "expand_spaces",
    "settings_key",
    "fixed_space",
    "RULES",
    "Catalogue",
    "OptionSpec",
    "get_catalogue",
    "register_catalogue",
    "register_shared_settings",
    "registered_catalogues",
    "Group",
    "Param",
    "Condition",
    "Categorical",
    "IntRange",
    "FloatRange",
]
