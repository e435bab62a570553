"""``plots/``'s figures drawn from plain data (:func:`raysearch.outputs._plots.plot_job`'s
specs) into PNG bytes, with matplotlib alone: this module imports nothing of raysearch, so a
search's plot process runs it as a script (``python _plot_render.py``) without importing the
``raysearch`` package (about as long again as matplotlib's own import, on a core its trials
use). The driver writes the bytes into ``plots/`` (:mod:`raysearch.outputs._plots_process`).

The process: warmed up with a small figure drawn (matplotlib's renderer, its font and the PNG
writer loaded), it reads one job (``{"specs": {file name: spec}}``) pickled on standard input,
answers ``{"answer": {file name: PNG bytes}}`` or ``{"error": "..."}`` pickled on standard
output, and ends; it ends without an answer when its standard input closes first. Ctrl-C
reaches the terminal's whole process group: the driver ends it, so it ignores Ctrl-C.

Example:
    >>> spec = {"kind": "importance", "names": ["per_channel", "calibrate_method"],
    ...         "values": [0.2, 0.8], "title": "parameter importance for cos"}
    >>> render({"param_importance.png": spec})["param_importance.png"][:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

__all__ = ["figure", "png", "render", "warm_up"]

#: The PNGs' resolution.
DPI = 110


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure(spec: Mapping[str, Any]) -> Any:
    """The matplotlib figure of ``spec`` (``kind`` ``metric`` or ``importance``); the caller
    closes it (``matplotlib.pyplot.close``)."""
    plt = _pyplot()
    if spec["kind"] == "importance":
        names = list(spec["names"])
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5), layout="constrained")
        ax.barh(names, list(spec["values"]), color="tab:blue")
        ax.set_xlabel("importance (PED-ANOVA, normalized)")
        ax.set_title(_wrapped(spec["title"]), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        return fig
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for label, color, xs, ys in spec["points"]:
        if xs:
            ax.scatter(xs, ys, color=color, s=18, label=label)
    if spec["best_x"]:
        ax.step(spec["best_x"], spec["best_y"], where="post", color="tab:orange",
                label="best so far")  # fmt: skip
    if spec["bound"] is not None:
        ax.axhline(spec["bound"], color="tab:red", linestyle="--",
                   label=f"candidate bound {spec['bound']:.6g}")  # fmt: skip
    if spec["float_metric"] is not None:
        ax.axhline(spec["float_metric"], color="black", linestyle=":", label="float model")
    ax.set_xlabel("trial (in start order)")
    ax.set_ylabel(spec["ylabel"])
    ax.set_title(_wrapped(spec["title"]))
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return fig


def _wrapped(title: str) -> str:
    """``title`` with each line wrapped to the figure's width: the constrained layout fits
    the axes to a title, never the figure, so a longer line would be cut at its edges."""
    import textwrap

    return "\n".join(textwrap.fill(line, 90) for line in title.splitlines())


def png(fig: Any) -> bytes:
    """``fig`` as PNG bytes. The figures are laid out by matplotlib's constrained layout, in
    the one drawing that writes them; ``bbox_inches="tight"`` would draw each twice."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def render(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, bytes]:
    """Each spec's figure as PNG bytes, by the same key (a file name of ``plots/``)."""
    plt = _pyplot()
    pngs = {}
    for name, spec in specs.items():
        fig = figure(spec)
        try:
            pngs[name] = png(fig)
        finally:
            plt.close(fig)
    return pngs


def warm_up() -> None:
    """Draw one small figure of each kind into PNG bytes: the first figure a process draws
    loads matplotlib's renderer, its font and the PNG writer, which the figures drawn after
    it then find loaded."""
    render(
        {
            "metric": {
                "kind": "metric",
                "points": [("trials", "tab:blue", [1, 2], [0.5, 0.25])],
                "best_x": [1, 2],
                "best_y": [0.5, 0.5],
                "bound": 0.4,
                "float_metric": 0.6,
                "ylabel": "metric",
                "title": "warm-up",
            },
            "importance": {"kind": "importance", "names": ["a"], "values": [1.0], "title": "-"},
        }
    )


def _serve() -> None:
    """The plot process (see the module's docstring)."""
    import os
    import pickle
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    warm_up()
    try:
        job = pickle.load(sys.stdin.buffer)
    except EOFError:  # closed without a job: nothing to draw
        return
    try:
        answer: dict[str, Any] = {"answer": render(job["specs"])}
    except Exception as exc:  # noqa: BLE001 - said by the driver, which draws them itself
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()
    except OSError:  # the driver closed the pipe (it ended, or gave up): no one to answer,
        os._exit(0)  # and nothing to flush at the interpreter's exit into a closed pipe


if __name__ == "__main__":
    _serve()
