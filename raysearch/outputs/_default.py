"""The setting the report sets the best against: ONNX Runtime's default setting when a trial
ran it, else the space's default setting (Auto's ``defaults`` stage, or the first setting).

Example:
    >>> is_backend_default({"activation_type": "QInt8", "per_channel": False,
    ...                     "op_types_to_quantize": None})
    True
    >>> is_backend_default({"activation_type": "QUInt8", "per_channel": False})
    False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysearch.quantize.backends.ort.options import DEFAULTS
from raysearch.space import Categorical
from raysearch.space.points import agrees
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig
    from raysearch.space import SearchSpace

__all__ = ["DefaultSetting", "default_setting"]

#: What the report calls each kind of default setting.
BACKEND_DEFAULT = "ONNX Runtime's default setting"
SPACE_DEFAULT = "the space's default setting"
#: Settings whose value ``False`` is ONNX Runtime's own default (left out, it is False).
_FALSE_BY_DEFAULT = ("per_channel", "reduce_range")
#: ``quantize_static`` and ``quant_mode``'s default.
_BACKEND_VALUES = {**DEFAULTS, "quant_mode": "static", "quantizer": "ort"}


@dataclass(frozen=True)
class DefaultSetting:
    """The trial that ran the default setting, and what the report calls that setting."""

    record: TrialRecord
    name: str


def _is_default_value(key: str, value: Any) -> bool:
    if value is None or value == [] or value == {}:
        return True  # unset: ONNX Runtime's default (every op, no node excluded, ...)
    if key in _BACKEND_VALUES:
        return value == _BACKEND_VALUES[key]
    if value is False:
        return key in _FALSE_BY_DEFAULT or key.startswith("include_")
    return False


def is_backend_default(settings: Mapping[str, Any]) -> bool:
    """Whether ``settings`` (nested or as dotted key paths) is ONNX Runtime's default setting:
    each one at ``quantize_static``'s default (``DEFAULTS``) and no ``extra_options``."""
    for key, value in settings.items():
        leaf = str(key).rsplit(".", 1)[-1]
        if str(key).startswith("extra_options") and value not in (None, {}):
            return False
        if not _is_default_value(leaf, value):
            return False
    return True


def _first_setting(space: SearchSpace) -> dict[str, Any]:
    """The space's default setting: its first start point completed with each active
    parameter's first choice, less what its validity rules call meaningless."""
    point = dict(space.points_to_evaluate[0]) if space.points_to_evaluate else {}
    for param in space.params:
        if param.name in point or not space.is_active(param, point):
            continue
        domain = param.domain
        point[param.name] = domain.choices[0] if isinstance(domain, Categorical) else domain.low
    return space.canonical(point)[0]


def default_setting(
    rows: Sequence[TrialRecord], config: SearchConfig | None
) -> DefaultSetting | None:
    """The first trial (in start order) that ran ONNX Runtime's default setting, else Auto's
    ``defaults`` stage's, else the first space's default; None when none ran."""
    for r in rows:
        settings = r.settings or r.params
        if isinstance(settings, Mapping) and settings and is_backend_default(settings):
            return DefaultSetting(r, BACKEND_DEFAULT)
    for r in rows:
        if r.stage == "defaults":
            return DefaultSetting(r, SPACE_DEFAULT)
    spaces = getattr(config, "search_spaces", None) or []
    if not spaces:
        return None
    default = _first_setting(spaces[0])
    for r in rows:
        point = r.point or r.params or {}
        if agrees(point, default) and agrees(default, point):
            return DefaultSetting(r, SPACE_DEFAULT)
    return None
