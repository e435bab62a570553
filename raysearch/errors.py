"""Errors raised for bad input, each naming what is wrong and where."""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator, Mapping

__all__ = [
    "InputError",
    "ConfigError",
    "ConfigErrors",
    "ErrorCollector",
    "DataError",
    "EvaluatorError",
    "DiskFullError",
    "is_disk_full",
    "suggest",
    "canonical_name",
]

#: ``errno`` values of a full disk: no space left, quota exceeded.
_DISK_FULL_ERRNOS = (28, 122)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


class InputError(ValueError):
    """Bad input from the user: the command line prints its one line and exits 2."""


class ConfigError(InputError):
    """A config, space or input that cannot be used: ``str(error)`` is ``"<path>: <message>"``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class ConfigErrors(ConfigError):
    """Several :class:`ConfigError` of one config: one line each, ``errors`` flattened.

    Example:
        >>> print(ConfigErrors([ConfigError("a", "bad"), ConfigError("b", "worse")]))
        a: bad
        b: worse
    """

    def __init__(self, errors: Iterable[ConfigError]) -> None:
        flat: list[ConfigError] = []
        for error in errors:
            flat.extend(error.errors if isinstance(error, ConfigErrors) else [error])
        if not flat:
            raise ValueError("ConfigErrors needs at least one error")
        self.errors = tuple(flat)
        self.path = flat[0].path
        self.message = flat[0].message
        InputError.__init__(self, "\n".join(str(e) for e in flat))


class ErrorCollector:
    """Collects the :class:`ConfigError` of independent checks, to report every mistake at once.

    Example:
        >>> errors = ErrorCollector()
        >>> with errors.check():
        ...     raise ConfigError("seed", "expected an integer")
        >>> errors.raise_any()
        Traceback (most recent call last):
        ...
        raysearch.errors.ConfigError: seed: expected an integer
    """

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Run the block; a ConfigError it raises is kept and the block is left."""
        try:
            yield
        except ConfigError as exc:
            self.errors.append(exc)

    def add(self, error: ConfigError) -> None:
        self.errors.append(error)

    def raise_any(self) -> None:
        """Raise the one error collected as itself, several as :class:`ConfigErrors`."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors)


class DataError(InputError):
    """Calibration or evaluation data that does not fit the model; the message is one line."""


class EvaluatorError(InputError):
    """The evaluator itself is unusable (it fails on the float model)."""


class DiskFullError(RuntimeError):
    """The output folder ran out of space: the search stopped, its journal intact (exit 1)."""


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or its cause is a full disk (``ENOSPC``/``EDQUOT``, or its text quoted).

    Example:
        >>> is_disk_full(RuntimeError("[ONNXRuntimeError] : 1 : FAIL : No space left on device"))
        True
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(exc) for text in _DISK_FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def suggest(word: str, candidates: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest candidate, or ``""``.

    Example:
        >>> suggest("calibrate_metod", ["calibrate_method", "per_channel"])
        " (did you mean 'calibrate_method'?)"
    """
    pool = list(candidates)
    match = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not match:  # names are read in any case (canonical_name): so are typos of them
        folded = {c.casefold(): c for c in pool}
        close = difflib.get_close_matches(word.casefold(), list(folded), n=1, cutoff=0.6)
        match = [folded[close[0]]] if close else []
    if not match:  # the one name that starts with the word
        prefixed = [c for c in pool if c.lower().startswith(word.lower())]
        match = prefixed[:1] if len(prefixed) == 1 else []
    return f" (did you mean '{match[0]}'?)" if match else ""


def canonical_name(
    value: object, names: Iterable[str], aliases: Mapping[str, str] | None = None
) -> str | None:
    """The name of ``names`` that ``value`` spells (itself, an alias, or in another case), or None:
    the one rule for a value from a fixed vocabulary.

    Example:
        >>> canonical_name("Cos", ["L2", "cos"]), canonical_name("minmax", ["MinMax", "Entropy"])
        ('cos', 'MinMax')
        >>> canonical_name("COSINE", ["cos"], {"cosine": "cos"})
        'cos'
    """
    if not isinstance(value, str):
        return None
    pool = list(names)
    aliases = aliases or {}
    if value in pool:
        return value
    if value in aliases:
        return aliases[value]
    folded = value.casefold()
    found = {name for name in pool if name.casefold() == folded}
    found |= {name for alias, name in aliases.items() if alias.casefold() == folded}
    return found.pop() if len(found) == 1 else None
