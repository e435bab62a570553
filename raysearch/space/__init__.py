"""Search spaces: both dialects, settings catalogues, validity rules, grid expansion and
define-by-run sampling. Pure data: the package imports no backend; backends register their
catalogues (:func:`~raysearch.space.catalogue.register_catalogue`) when imported."""

from raysearch.space.catalogue import Catalogue, OptionSpec, get_catalogue
from raysearch.space.points import fixed_space
from raysearch.space.rules import RULES
from raysearch.space.space import SearchSpace, expand_spaces, settings_key
from raysearch.space.tree import Categorical, FloatRange, Group, IntRange, Param

__all__ = [
    "SearchSpace",
    "expand_spaces",
    "settings_key",
    "fixed_space",
    "RULES",
    "Catalogue",
    "OptionSpec",
    "get_catalogue",
    "Group",
    "Param",
    "Categorical",
    "IntRange",
    "FloatRange",
]
