"""A value checked against the annotated type of the library parameter it is passed to
(``sampler_options``, ``loggers``), so that it is refused in one line before anything runs.
Only builtins, ``None``, ``Literal``, ``Callable``, unions and plain classes are checked.

Example:
    >>> from typing import Literal, Optional
    >>> def init(mode: Optional[Literal["online", "offline"]] = None, n: int = 1): ...
    >>> types = parameter_types(init)
    >>> expected_instead("five", types["n"])
    'an integer'
    >>> expected_instead("offlin", types["mode"])
    "one of 'online', 'offline' or null"
"""

from __future__ import annotations

import collections.abc
import inspect
import numbers
import types
import typing
from typing import Any

__all__ = ["parameter_types", "expected_instead", "literal_choices", "wrong_value"]

#: Names an annotation written as text may use without its module importing them at run time.
_TYPING_NAMES: dict[str, Any] = {
    "Any": Any,
    "Callable": collections.abc.Callable,
    "Sequence": collections.abc.Sequence,
    "Mapping": collections.abc.Mapping,
    "Iterable": collections.abc.Iterable,
    "Literal": typing.Literal,
    "Optional": typing.Optional,
    "Union": typing.Union,
}


def parameter_types(function: Any) -> dict[str, Any]:
    """Each annotated parameter of ``function`` and its type (unevaluable ones left out)."""
    try:
        hints = typing.get_type_hints(function)
        hints.pop("return", None)
        return hints
    except Exception:  # noqa: BLE001 - some annotation names a type-checking-only import
        pass
    namespace = {**_TYPING_NAMES, **getattr(inspect.unwrap(function), "__globals__", {})}
    out: dict[str, Any] = {}
    for name, param in inspect.signature(function).parameters.items():
        annotation = param.annotation
        if annotation is param.empty:
            continue
        if isinstance(annotation, str):

            def one(value: Any) -> None: ...

            one.__annotations__ = {"value": annotation}
            try:
                # The annotation's own text, in its module's names, one parameter at a time.
                annotation = typing.get_type_hints(one, globalns=dict(namespace))["value"]
            except Exception:  # noqa: BLE001 - a type-checking-only name: not checked
                continue
        out[name] = annotation
    return out


def expected_instead(value: Any, annotation: Any) -> str | None:
    """None when ``value`` fits ``annotation``, else what it expects, in words."""
    return None if _fits(value, annotation) is not False else _describe(annotation)


def wrong_value(value: Any, annotation: Any) -> str | None:
    """None when ``value`` fits ``annotation``, else what is expected, what was given, and the
    closest allowed word.
    """
    from raysearch.errors import suggest

    expected = expected_instead(value, annotation)
    if expected is None:
        return None
    words = [str(v) for v in literal_choices(annotation) if isinstance(v, str)]
    hint = suggest(value, words) if isinstance(value, str) and words else ""
    return f"{expected}, got {value!r}{hint}"


def literal_choices(annotation: Any) -> list[Any]:
    """The values a ``Literal`` in ``annotation`` (or a union holding one) allows."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return [v for arm in typing.get_args(annotation) for v in literal_choices(arm)]
    return []


def _fits(value: Any, annotation: Any) -> bool | None:  # noqa: C901 - one case per kind
    """Whether ``value`` fits ``annotation``; None when the annotation cannot tell."""
    if annotation in (Any, object, inspect.Parameter.empty):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        answers = [_fits(value, arm) for arm in args]
        if True in answers:
            return True
        return None if None in answers else False
    if origin is typing.Annotated:
        return _fits(value, args[0])
    kind = origin if origin is not None else annotation
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is collections.abc.Callable:
        return callable(value)
    if not isinstance(kind, type):
        return None
    return isinstance(value, kind)


def _describe(annotation: Any) -> str:
    """``annotation`` in words, as an error message says what it expects."""
    if annotation is None or annotation is type(None):
        return "null"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        values = ["null" if a is None else repr(a) for a in args]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if origin in (typing.Union, types.UnionType):
        # The literal values first, null last: "one of 'online', 'offline' or null".
        arms = sorted(
            args, key=lambda a: (a is type(None), typing.get_origin(a) is not typing.Literal)
        )
        words: list[str] = []
        for arm in arms:
            word = _describe(arm)
            if word not in words:
                words.append(word)
        return " or ".join(words)
    kind = origin if origin is not None else annotation
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if kind in names:
        return names[kind]
    if kind in (list, collections.abc.Sequence):
        return "a list"
    if kind in (dict, collections.abc.Mapping):
        return "a mapping"
    if kind is collections.abc.Callable:
        return "a function"
    return f"a {getattr(kind, '__name__', kind)}"
