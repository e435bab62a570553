"""Values as the reports show them: a setting's value in words where its raw value says
nothing (``op_types_to_quantize: null`` is every op type ONNX Runtime quantizes), sizes in
human units, numbers with the digits that tell them apart.

Example:
    >>> setting_value("op_types_to_quantize", None), setting_value("per_channel", True)
    ('every op', 'yes')
    >>> human_bytes(3163737), human_bytes(839889), human_bytes(512)
    ('3.16 MB', '840 kB', '512 bytes')
    >>> setting_text({"per_channel": False, "op_types_to_quantize": ["MatMul", "Conv"]})
    'per_channel = no, op_types_to_quantize = MatMul, Conv'
    >>> distinct_labels([99.99, 99.999, 99.99])
    ['99.99', '99.999', '99.99']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["NULL_WORDS", "show", "setting_value", "setting_text", "human_bytes", "distinct_labels"]

#: What a setting's null means, by its last key (the backends' catalogues: null is "not
#: restricted"); any other null shows as ``null``.
NULL_WORDS = {
    "op_types_to_quantize": "every op",
    "nodes_to_quantize": "every node",
    "nodes_to_exclude": "none",
}


def show(value: Any) -> str:
    """A value of a record or the summary: empty for None, ``yes``/``no``, 6 significant
    digits, a list joined by commas."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "[]"
    return str(value)


def setting_value(name: str, value: Any) -> str:
    """The value of the setting ``name`` (a dotted key path) that a trial ran: a null in its
    meaning (:data:`NULL_WORDS`), else :func:`show`."""
    if value is None:
        return NULL_WORDS.get(name.rsplit(".", 1)[-1], "null")
    return show(value)


def setting_text(params: Mapping[str, Any]) -> str:
    """A setting in one line: ``name = value`` for each of its parameters."""
    return ", ".join(f"{name} = {setting_value(name, value)}" for name, value in params.items())


def human_bytes(n_bytes: Any) -> str:
    """A size in bytes with a unit people read (decimal: kB, MB, GB), 3 significant digits;
    empty when there is no number."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)):
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} bytes"


def _shortest(value: float) -> str:
    """``value`` in the fewest significant digits (6 at most) that read back as it exactly
    (``99.999``, not ``100``), else in 6."""
    for digits in range(1, 7):
        text = f"{value:.{digits}g}"
        if float(text) == value:
            return text
    return f"{value:.6g}"


def distinct_labels(values: Sequence[float]) -> list[str]:
    """Each number as :func:`_shortest` writes it, with more digits (up to 15) where two
    distinct ones would read the same: ``99.99`` and ``99.999`` never both read ``100``."""
    labels = {v: _shortest(v) for v in set(values)}
    for digits in range(7, 16):
        if len(set(labels.values())) == len(labels):
            break
        labels = {v: f"{v:.{digits}g}" for v in labels}
    return [labels[v] for v in values]
