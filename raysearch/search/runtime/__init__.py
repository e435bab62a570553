"""The Ray runtime of a search: starting or joining Ray, the nodes, what a cluster keeps warm."""

from raysearch.search.runtime._warm import KeptWarm

__all__ = ["KeptWarm"]
