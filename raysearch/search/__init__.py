"""Search on Ray Tune: searchers, the trainable, the stopper, callbacks, resume.

Example:
    >>> from raysearch.search import AutoSearch
    >>> result = AutoSearch("config.yaml").run()            # doctest: +SKIP
    >>> result.summary["stop_reason"], result.best_params   # doctest: +SKIP
"""

from raysearch.search.progress import ProgressCallback
from raysearch.search.runner import AutoSearch, SearchResult, resume_search, run_search
from raysearch.search.searchers import SettingSearcher, check_algo_available, make_sampler
from raysearch.search.stopper import STOP_REASONS, CandidateStopper

__all__ = [
    "AutoSearch",
    "SearchResult",
    "run_search",
    "resume_search",
    "CandidateStopper",
    "STOP_REASONS",
    "SettingSearcher",
    "ProgressCallback",
    "make_sampler",
    "check_algo_available",
]
