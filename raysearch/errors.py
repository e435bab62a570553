"""Errors raised for bad input, each naming what is wrong and where."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["InputError", "ConfigError", "DataError", "EvaluatorError", "suggest"]


class InputError(ValueError):
    """Bad input from the user (config, model, data, evaluator): the command line prints its
    one-line message and exits with status 2."""


class ConfigError(InputError):
    """A config, search space or input that cannot be used, with the key path it concerns.

    ``str(error)`` is one line: ``"search_space.calibrate_metod: unknown key (did you mean
    'calibrate_method'?)"``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class DataError(InputError):
    """Calibration or evaluation data that does not fit the model; the message is one line.

    ``DataError`` is a ``ValueError`` (through :class:`raysearch.errors.InputError`).
    """


class EvaluatorError(InputError):
    """The evaluator itself is unusable (it fails on the float model)."""


def suggest(word: str, candidates: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest candidate, or ``""``.

    Example:
        >>> suggest("calibrate_metod", ["calibrate_method", "per_channel"])
        " (did you mean 'calibrate_method'?)"
    """
    pool = list(candidates)
    match = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in pool}
        if word.lower() in lowered:
            match = [lowered[word.lower()]]
        else:
            prefixed = [c for c in pool if c.lower().startswith(word.lower())]
            match = prefixed[:1] if len(prefixed) == 1 else []
    return f" (did you mean '{match[0]}'?)" if match else ""
