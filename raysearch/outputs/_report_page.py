"""The fixed parts of ``report.html`` and ``batch_report.html``: their style and the table's
script, written by hand (the report opens offline): a click on a header sorts by it (numbers
by a cell's ``data-v``, empty cells last), and the filter box keeps the rows that hold every
word typed.

Example:
    >>> "<style>" in page_head("title", "") and "sortTable" in TABLE_SCRIPT
    True
"""

from __future__ import annotations

import html

__all__ = ["page_head"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #222; background: #fff; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
p.caption { color: #555; margin: 0.2em 0 0.6em; }
table { border-collapse: collapse; font-size: 0.85em; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; }
#trials { width: 100%; font-size: 0.8em; }
#trials th, #trials td { padding: 2px 4px; }
#trials td.num, #trials td:nth-child(2) { white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
#trials th { cursor: pointer; user-select: none; }
#trials th[aria-sort="ascending"]::after { content: " \\25B2"; }
#trials th[aria-sort="descending"]::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { background: #fdecea; } tr.candidate td { background: #eaf7ea; }
tr.stopped td { color: #777; }
.changed { font-weight: bold; }
.tablebox { overflow: auto; max-height: 80vh; }
.error { font-family: monospace; white-space: pre-wrap; }
.chart { margin-bottom: 1.5em; max-width: 100%; }
.chart .js-plotly-plot { max-width: 100%; }
p { overflow-wrap: anywhere; }
"""

#: The trials table's sorting and filtering.
TABLE_SCRIPT = """
function cellKey(row, col, numeric) {
  const cell = row.cells[col];
  const raw = cell.hasAttribute("data-v") ? cell.getAttribute("data-v") : cell.textContent;
  if (raw === "") return null;
  if (numeric) { const v = parseFloat(raw); return isNaN(v) ? null : v; }
  return raw.toLowerCase();
}
function sortTable(table, col) {
  const th = table.tHead.rows[0].cells[col];
  const numeric = th.getAttribute("data-type") === "num";
  const up = th.getAttribute("aria-sort") !== "ascending";
  for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", up ? "ascending" : "descending");
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort(function (a, b) {
    const x = cellKey(a, col, numeric), y = cellKey(b, col, numeric);
    if (x === null || y === null) return (x === null) - (y === null);
    const c = x < y ? -1 : x > y ? 1 : 0;
    return up ? c : -c;
  });
  for (const row of rows) body.appendChild(row);
}
function filterTable(table, text, counter) {
  const words = text.toLowerCase().split(/\\s+/).filter(Boolean);
  let shown = 0;
  for (const row of table.tBodies[0].rows) {
    const hay = row.textContent.toLowerCase();
    const keep = words.every(function (w) { return hay.includes(w); });
    row.hidden = !keep;
    if (keep) shown += 1;
  }
  const noun = table.getAttribute("data-noun") || "trials";
  counter.textContent = shown + " of " + table.tBodies[0].rows.length + " " + noun + " shown";
}
document.addEventListener("DOMContentLoaded", function () {
  const table = document.getElementById("trials");
  if (!table) return;
  Array.from(table.tHead.rows[0].cells).forEach(function (th, col) {
    th.addEventListener("click", function () { sortTable(table, col); });
  });
  const box = document.getElementById("trials-filter");
  const counter = document.getElementById("trials-count");
  box.addEventListener("input", function () { filterTable(table, box.value, counter); });
  filterTable(table, "", counter);
});
"""


def page_head(title: str, plotly_js: str, plotly_src: str | None = None) -> str:
    """The document's start up to ``<body>``: its title, the style, plotly.js inlined
    (``plotly_js``; empty without charts) or loaded from ``plotly_src``, and the table's
    script."""
    script = f'<script type="text/javascript">{plotly_js}</script>\n' if plotly_js else ""
    if plotly_src:
        script = f'<script src="{html.escape(plotly_src, quote=True)}"></script>\n'
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n{script}"
        f"<script>{TABLE_SCRIPT}</script>\n</head>\n<body>\n"
    )
