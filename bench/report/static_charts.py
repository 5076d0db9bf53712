"""Charts without V8: the same Vega-Lite chart drawn by matplotlib, for when vl-convert's V8 cannot start.

V8 reserves a large address space up front (over 64 GB; the probe found 300 GB enough) and traps (SIGTRAP, the
whole process gone) when `ulimit -v` refuses it. Where an address-space limit is set, a child process tries
vl-convert once (v8_usable); if it cannot, every report chart is drawn from its own Vega-Lite spec (data, marks,
encodings, layers, facets, simple filters) by matplotlib into static SVG, captioned as such. Plainer than
vl-convert's (no tooltips, approximate offsets), with the same data.
"""

from __future__ import annotations

import io
import math
import re
import resource
import subprocess
import sys
from functools import cache

NOTE = "drawn without V8 (vl-convert cannot start under this process's address-space limit, ulimit -v)"
_PROBE = ("import vl_convert as v; v.vegalite_to_svg({'data': {'values': [{'a': 1}]}, 'mark': 'bar', "
          "'encoding': {'x': {'field': 'a', 'type': 'quantitative'}}})")
_FILTER = re.compile(r"^\s*(!)?\s*(isValid\()?\s*datum\.(\w+)\s*\)?\s*$")


@cache
def v8_usable() -> bool:
    """Whether vl-convert's V8 starts in this process's limits: always without an address-space limit, else as a
    child process with the same limit finds (its trap kills only the child)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return True
    try:
        return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def to_svg(spec: dict) -> str:
    """Static SVG of a Vega-Lite spec (chart.to_dict()) drawn by matplotlib, with NOTE under it."""
    from matplotlib.figure import Figure

    panels = _panels(spec)
    cols = min(len(panels), 3) or 1
    rows = math.ceil(len(panels) / cols) or 1
    w = max(4.0, min(11.0, (spec.get("width") if isinstance(spec.get("width"), int | float) else 520) / 80 * cols))
    fig = Figure(figsize=(w, 3.2 * rows + 0.4), layout="constrained")
    for i, (title, units) in enumerate(panels or [("", [])]):
        ax = fig.add_subplot(rows, cols, i + 1)
        for unit in units:
            try:
                _draw(ax, unit)
            except (KeyError, TypeError, ValueError):
                continue  # one layer the plain renderer cannot read: the others still show
        if title:
            ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(_title(spec), fontsize=10)
    fig.supxlabel(NOTE, fontsize=7, color="#777")
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _title(spec: dict) -> str:
    t = spec.get("title", "")
    return str(t.get("text", "") if isinstance(t, dict) else t)


def _panels(spec: dict) -> list[tuple[str, list[dict]]]:
    """(panel title, the units drawn in it): layers share a panel; facets and concatenations get one each."""
    datasets = spec.get("datasets", {})

    def units(node: dict, data: dict | None, enc: dict, transforms: list) -> list[dict]:
        data = node.get("data", data)
        enc = {**enc, **node.get("encoding", {})}
        transforms = transforms + node.get("transform", [])
        if "layer" in node:
            return [u for layer in node["layer"] for u in units(layer, data, enc, transforms)]
        if "mark" not in node:
            return []
        values = datasets.get(data.get("name"), []) if data and "name" in data else (data or {}).get("values", [])
        return [{"mark": node["mark"], "encoding": enc, "rows": _filtered(values, transforms)}]

    def walk(node: dict, data: dict | None) -> list[tuple[str, list[dict]]]:
        data = node.get("data", data)
        for key in ("vconcat", "hconcat", "concat"):
            if key in node:
                return [p for sub in node[key] for p in walk(sub, data)]
        if "facet" in node and "spec" in node:
            facet = node["facet"]
            field = (facet.get("field") or facet.get("row", {}).get("field") or facet.get("column", {}).get("field"))
            inner = units(node["spec"], data, {}, [])
            keys = sorted({r.get(field) for u in inner for r in u["rows"]}, key=str)
            return [(f"{field} = {k}", [{**u, "rows": [r for r in u["rows"] if r.get(field) == k]} for u in inner])
                    for k in keys]
        return [("", units(node, data, {}, []))]

    return walk(spec, None)


def _filtered(rows: list[dict], transforms: list) -> list[dict]:
    """The rows a `datum.X` / `!datum.X` / `isValid(datum.X)` filter keeps; other transforms are not applied."""
    for t in transforms:
        m = _FILTER.match(str(t.get("filter", ""))) if isinstance(t, dict) else None
        if m:
            neg, valid, field = m.groups()
            keep = (lambda v: v is not None and v == v) if valid else bool  # noqa: E731, PLR0124 (NaN != NaN)
            rows = [r for r in rows if keep(r.get(field)) != bool(neg)]
    return rows


def _channel(enc: dict, name: str) -> tuple[str | None, str, str | None]:
    """(field, type, scale type) of an encoding channel."""
    c = enc.get(name)
    if not isinstance(c, dict):
        return None, "", None
    return c.get("field"), c.get("type", ""), (c.get("scale") or {}).get("type")


def _num(v: object) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _draw(ax, unit: dict) -> None:  # noqa: ANN001 (a matplotlib Axes)
    mark = unit["mark"]["type"] if isinstance(unit["mark"], dict) else unit["mark"]
    enc, rows = unit["encoding"], unit["rows"]
    xf, xt, xs = _channel(enc, "x")
    yf, yt, ys = _channel(enc, "y")
    cf, _, _ = _channel(enc, "color")
    if mark == "text" or not rows and mark != "rule":
        return
    for axis, scale in (("x", xs), ("y", ys)):
        if scale in ("log", "symlog"):
            getattr(ax, f"set_{axis}scale")(scale)
    for axis, chan in (("x", "x"), ("y", "y")):
        c = enc.get(chan)
        if isinstance(c, dict) and (c.get("title") or c.get("field")):
            getattr(ax, f"set_{axis}label")(str(c.get("title") or c.get("field")), fontsize=8)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get(cf)) if cf else "", []).append(r)
    for label, rs in groups.items():
        kw = {"label": label} if label else {}
        if mark == "rule":
            _rule(ax, enc, rs, xf, yf)
        elif mark in ("bar", "rect"):
            _bars(ax, enc, rs, (xf, xt), (yf, yt), kw)
        elif mark == "area" and "y2" in enc:
            rs = sorted(rs, key=lambda r: _num(r.get(xf)))
            ax.fill_between([_num(r.get(xf)) for r in rs], [_num(r.get(yf)) for r in rs],
                            [_num(r.get(enc["y2"]["field"])) for r in rs], alpha=0.15, **kw)
        elif mark in ("line", "area"):
            rs = sorted(rs, key=lambda r: _num(r.get(xf)))
            ax.plot([_num(r.get(xf)) for r in rs], [_num(r.get(yf)) for r in rs], marker=".", **kw)
        else:  # point, circle, square, tick
            ax.scatter([_pos(r.get(xf), xt) for r in rs], [_pos(r.get(yf), yt) for r in rs], s=14, **kw)


def _pos(v: object, kind: str) -> object:
    return str(v) if kind in ("nominal", "ordinal") else _num(v)


def _rule(ax, enc: dict, rows: list[dict], xf: str | None, yf: str | None) -> None:  # noqa: ANN001
    if xf and "x2" in enc and yf:
        for r in rows:
            ax.hlines(_pos(r.get(yf), enc["y"].get("type", "")), _num(r.get(xf)), _num(r.get(enc["x2"]["field"])))
    elif xf and not yf:
        for r in rows:
            ax.axvline(_num(r.get(xf)), linestyle="--", color="#d62728", linewidth=1)
    elif yf and not xf:
        for r in rows:
            ax.axhline(_num(r.get(yf)), linestyle="--", color="#d62728", linewidth=1)


def _bars(ax, enc: dict, rows: list[dict], x: tuple, y: tuple, kw: dict) -> None:  # noqa: ANN001
    (xf, xt), (yf, yt) = x, y
    if "x2" in enc:  # bins: x..x2 wide
        lo = [_num(r.get(xf)) for r in rows]
        ax.bar(lo, [_num(r.get(yf)) for r in rows], width=[_num(r.get(enc["x2"]["field"])) - a
                                                           for r, a in zip(rows, lo, strict=True)],
               align="edge", alpha=0.6, **kw)
    elif yt in ("nominal", "ordinal") and xt == "quantitative":
        ax.barh([str(r.get(yf)) for r in rows], [_num(r.get(xf)) for r in rows], alpha=0.8, **kw)
    else:
        ax.bar([_pos(r.get(xf), xt) for r in rows], [_num(r.get(yf)) for r in rows], alpha=0.8, **kw)
