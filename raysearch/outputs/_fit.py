"""A report's plotly figure made to fit its page and read right: no fixed width (Optuna's
slice plot is 300 px per parameter, wider than a window from five parameters on: the page
sizes it), and numeric axes labelled with the digits that tell their values apart (Optuna's
parallel coordinates write each tick in 3 digits: ``100 100 100`` for 99.99 to 99.999).

Example:
    >>> import plotly.graph_objects as go
    >>> fig = go.Figure(layout={"width": 1800})
    >>> fit_figure(fig).layout.width is None
    True
    >>> tick_labels([99.99, 99.999])
    ['99.99', '99.9922', '99.9945', '99.9967', '99.999']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from raysearch.outputs._values import distinct_labels

__all__ = ["fit_figure", "relabel_parallel"]

#: The ticks Optuna's parallel coordinates put on a numeric axis (``numpy.linspace``'s num).
AXIS_TICKS = 5
#: The label Optuna gives the tick of the trials that lack a parameter.
MISSING_LABEL = "None"


def tick_labels(values: Sequence[float]) -> list[str]:
    """The labels of the ticks Optuna's parallel coordinates put on an axis of ``values``
    (the lowest, the highest and evenly between: :data:`AXIS_TICKS`), in the digits that keep
    them apart."""
    import numpy as np

    low, high = min(values), max(values)
    if low == high:
        return distinct_labels([float(low)])
    return distinct_labels([float(v) for v in np.linspace(low, high, num=AXIS_TICKS)])


def _label(name: str) -> str:
    """An axis's name as Optuna's parallel coordinates write it (cut at 20 characters)."""
    return name if len(name) < 20 else f"{name[:17]}..."


def relabel_parallel(fig: Any, columns: Mapping[str, Sequence[Any]]) -> Any:
    """Optuna's parallel-coordinates ``fig`` (changed in place, and returned) with each
    numeric axis's tick labels written in the digits that tell them apart; ``columns``: each
    axis's values over the complete trials (the metric's and each parameter's; None where a
    trial lacks the parameter), by name. An axis whose ticks do not match is left as is."""
    axis = fig.layout.xaxis
    names = {_label(name): name for name in columns} | {name: name for name in columns}
    by_axis: dict[int, list[Any]] = {}
    for note in fig.layout.annotations or ():
        if isinstance(note.x, (int, float)) and note.text != MISSING_LABEL:
            by_axis.setdefault(int(note.x), []).append(note)
    for index, label in enumerate(axis.ticktext or ()):
        values = columns.get(names.get(label, ""), ())
        numbers = [
            float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        notes = by_axis.get(index, [])
        if not numbers or len(numbers) != sum(v is not None for v in values):
            continue  # a categorical axis: Optuna writes its choices in full
        labels = tick_labels(numbers)
        if len(labels) == len(notes):
            for note, text in zip(notes, labels):
                note.text = text
    return fig


def fit_figure(fig: Any) -> Any:
    """``fig`` (changed in place, and returned) sized by its page; a 3-D scene (the Pareto
    front of three objectives) taller, with its camera back far enough that no axis title
    is cut at the figure's edge."""
    fig.update_layout(width=None, autosize=True)
    if any(trace.type == "scatter3d" for trace in fig.data):
        fig.update_layout(
            height=650,
            margin={"l": 0, "r": 0, "t": 60, "b": 0},
            scene_camera={"eye": {"x": 1.9, "y": 1.9, "z": 1.3}},
        )
    return fig
