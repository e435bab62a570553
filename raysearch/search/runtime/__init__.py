"""The Ray runtime of a search: starting or joining Ray, shipping the model to other nodes, what a
lost node took with it, the start barrier, the score pool, and what a running cluster keeps
warm between searches (:class:`KeptWarm`)."""

from raysearch.search.runtime._warm import KeptWarm

__all__ = ["KeptWarm"]
