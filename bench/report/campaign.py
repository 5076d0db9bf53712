"""A campaign's report: per deployment and load the highest rate measured within the SLO and its $ per 1M output
tokens; each deployment against its baseline at saturation (FP8 KV, INT4 experts, the checksum's overhead),
measured and predicted. One function makes the figures (campaign_matrix), one the tables (campaign_sections);
the CLI (campaign_screen.py), the HTML page and the dashboard's Campaigns page all show those tables.

Rates are requests/s of the deployment's own GPUs (a twin's are divided by its time scale); $ per 1M output tokens
is usd_per_million (bench/model/step/perfmodel.py) at the output tokens/s of that rate, the catalog's $/GPU-hour.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from bench.model import behind_said, cell_gain, gain_words
from bench.report import quality
from bench.store import Store, replacing


@dataclass
class Matrix:
    campaign_id: str
    name: str
    status: str
    cells: list[dict]  # one per cell: deployment, load, status, error, log, and the result's figures
    gains: list[dict] = field(default_factory=list)  # deployment vs its baseline per load, measured and predicted


def campaign_matrix(db: str | Path, campaign_id: str) -> Matrix:
    with Store(db, read_only=True).connect() as con:
        head = con.execute("SELECT name, status FROM campaigns WHERE campaign_id = ?", [campaign_id]).fetchone()
        rows = con.execute("SELECT cell, deployment, load, status, result, error, log FROM campaign_cells "
                           "WHERE campaign_id = ? ORDER BY started_at", [campaign_id]).fetchall()
        if head is None:
            from bench.errors import BadInput

            raise BadInput(f"no campaign {campaign_id} in {db}")
        cells = [{"cell": c, "deployment": d, "load": x, "status": s, "error": e, "log": lg,
                  **(json.loads(r) if r else {})} for c, d, x, s, r, e, lg in rows]
        pairs = quality.cell_pairs(con, campaign_id=campaign_id) if any(c.get("quality") for c in cells) else None
    gains = _gains(cells)
    for g in gains if pairs is not None else []:  # a campaign with eval stages: quality beside each gain
        g["quality"] = quality.quality_beside(g, pairs)
        g["change"] = next((q["change"] for q in pairs if (q["deployment"], q["load"]) == (g["deployment"],
                                                                                           g["load"])), g["what"])
    return Matrix(campaign_id, head[0], head[1], cells, gains)


def latest_campaign(db: str | Path) -> str | None:
    with Store(db, read_only=True).connect() as con:
        row = con.execute("SELECT campaign_id FROM campaigns ORDER BY submitted_at DESC LIMIT 1").fetchone()
    return row[0] if row else None


def _what_differs(cell: dict, base: dict) -> str:
    parts = []
    if cell.get("kv_dtype") != base.get("kv_dtype"):
        parts.append(f"{'FP8' if str(cell.get('kv_dtype')).startswith('fp8') else cell.get('kv_dtype')} KV")
    if cell.get("weights") != base.get("weights"):
        w = str(cell.get("weights"))
        parts.append(f"INT4 experts ({w})" if w.startswith("int4") else f"{w} weights")
    if cell.get("kv_checksum") != base.get("kv_checksum"):
        parts.append(f"checksum {cell.get('kv_checksum')}")
    if cell.get("gpus") != base.get("gpus"):  # e.g. a disaggregated twin: prefill + decode GPUs
        parts.append(f"{cell.get('gpus')} GPUs vs {base.get('gpus')}")
    return " + ".join(parts) or "same configuration"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _gains(cells: list[dict]) -> list[dict]:
    done = {(c["deployment"], c["load"]): c for c in cells if c["status"] == "completed"}
    out = []
    for (dep, load), c in done.items():
        base = done.get((c.get("baseline"), load))
        if not c.get("baseline") or base is None:
            continue
        g = cell_gain(c, base)  # with repeats, the ratio of geometric means
        measured = g.value if g else _ratio(c["measured_rps"], base["measured_rps"])
        predicted = _ratio(c.get("predicted_rps"), base.get("predicted_rps"))
        row = {"deployment": dep, "baseline": base["deployment"], "load": load, "what": _what_differs(c, base),
               "measured_gain": measured, "predicted_gain": predicted,
               "gain_interval": [g.low, g.high] if g else [None, None], "gain_method": g.method if g else "",
               "verdict": gain_words(g),
               "twin_behind": max(c.get("twin_behind") or 0.0, base.get("twin_behind") or 0.0) or None,
               "error": measured / predicted - 1 if measured and predicted else None}
        out.append(_too_busy(row))
    return out


def half_width(g: dict) -> float | None:
    """A gain's interval's half-width as a share of the gain (its wider side), None without an interval."""
    lo, hi = (g.get("gain_interval") or [None, None])[:2]
    v = g.get("measured_gain")
    return None if lo is None or hi is None or not v else max(hi - v, v - lo) / v


def _too_busy(g: dict) -> dict:
    """A gain whose twin fell further behind its modelled pace (a share of a stage's time) than the gain's interval
    is wide, or past TWIN_BEHIND_OK where it has no interval, measured this host's CPU more than the change: it is
    "not measured: host too busy", with no gain, interval or error to quote (what was seen stays in seen_gain)."""
    lag, half = g.get("twin_behind"), half_width(g)
    if not behind_said(lag) or g.get("measured_gain") is None or (half is not None and lag <= half):
        return g
    allowed = f"its interval's half-width, {half:.0%}" if half is not None else "what a gain without an interval " \
        "allows"
    return {**g, "seen_gain": g["measured_gain"], "seen_interval": g["gain_interval"], "measured_gain": None,
            "gain_interval": [None, None], "error": None, "busy": True,
            "verdict": f"not measured: host too busy (a twin fell {lag:.0%} of a stage behind its modelled pace, more "
                       f"than {allowed}; {g['measured_gain']:.2f}x seen; measure again on a quiet host)"}


def gain_said(g: dict) -> str:
    """What a gain's interval lets one say, and how the interval was found (the report, the demo and its benchmark
    say it so)."""
    lo, hi = (g.get("gain_interval") or [None, None])[:2]
    how = f" ({g['gain_method']})" if lo is not None and hi is not None and g.get("gain_method") else ""
    lag = g.get("twin_behind")
    if g.get("busy"):
        return g["verdict"]
    behind = (f"; a twin fell {lag:.0%} of a stage behind its modelled pace in these cells (this host's CPU, not the "
              "modelled GPUs): less sure than its interval says, measure again on a quiet host") if behind_said(lag) \
        else ""
    return g.get("verdict", "") + how + behind


def _f(v: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _predicted(c: dict) -> str:
    """The model's rate with its 80 % interval (bench/model/evidence/interval.py), as the plan shows it."""
    lo, hi = c.get("predicted_rps_low"), c.get("predicted_rps_high")
    return _f(c.get("predicted_rps")) + (f" ({lo:.3g}-{hi:.3g})" if lo is not None and hi is not None else "")


def _predicted_usd(c: dict) -> str:
    """The model's $ per 1M output tokens with its 80 % interval: the inverse of the rate's."""
    usd, rps, lo, hi = (c.get(k) for k in ("predicted_usd_per_m", "predicted_rps", "predicted_rps_low",
                                            "predicted_rps_high"))
    if not (usd and rps and lo and hi):
        return _f(usd, ",.2f")
    return f"{usd:,.2f} ({usd * rps / hi:,.2f}-{usd * rps / lo:,.2f})"


PREDICTED_GAIN = ("predicted gain: the model's ratio of two predictions that share their regime's error, so the 80 % "
                  "intervals do not bound it, and no published pair of runs measures such a gain: it has no interval")


def _how(c: dict) -> str:
    """How many repeats, and how the cell's intervals were found."""
    n = str(c.get("repeats", "-"))
    lo = (c.get("measured_rps_interval") or [None])[0]
    return n if lo is None or not c.get("interval_method") else f"{n} ({c['interval_method']})"


def _fi(v: float | None, interval: list | None, spec: str = ".3g", suffix: str = "") -> str:
    """A figure with its 90 % interval when it has one."""
    lo, hi = (interval or [None, None])[:2]
    if v is None or lo is None or hi is None:
        return _f(v, spec, suffix)
    return f"{v:{spec}}{suffix} [{lo:{spec}}-{hi:{spec}}]"


def campaign_sections(m: Matrix, detail: bool = False) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the report's tables, in the order shown; `detail`: also each cell's conditions and
    every stage's request counts (the HTML report and the Campaigns page; the terminal has the stage lines)."""
    cells = [[c["cell"], c["status"], _fi(c.get("measured_rps"), c.get("measured_rps_interval"))
              + (" (lower bound)" if c.get("lower_bound") else ""),
              _predicted(c) if not c.get("not_predicted") else "not predicted",
              _fi(c.get("measured_usd_per_m"), c.get("measured_usd_per_m_interval"), ",.2f"),
              _predicted_usd(c), _how(c),
              _f(c.get("bracket") and c["bracket"] * 100, ".1f", " %"), str(c.get("stages", "-")),
              (c.get("saturation") or _first_line(c.get("error"))) + _behind(c)]
             for c in m.cells]
    gains = [[g["deployment"], g["baseline"], g["load"], g["what"],
              "not measured" if g.get("busy") else _fi(g["measured_gain"], g.get("gain_interval"), ".2f", "x"),
              gain_said(g),
              _f(g["predicted_gain"], ".2f", "x"), _f(g["error"] and g["error"] * 100, "+.0f", " %")]
             for g in m.gains]
    with_quality = any("quality" in g for g in m.gains)
    if with_quality:
        for g, row in zip(m.gains, gains, strict=True):
            row.append(g.get("quality", "-"))
    out = [
        (f"Campaign {m.name} ({m.campaign_id}, {m.status}): highest rate within the SLO per cell "
         "(mean of the repeats [90 % interval]; bracket: how close the first rate past the SLO was)",
         ["cell", "status", "measured req/s", "predicted req/s (80 %)", "measured $/1M out",
          "predicted $/1M out (80 %)", "repeats (interval)", "bracket", "stages", "saturation / error"], cells),
        ("Against the baseline at saturation (gain: highest rate within the SLO / the baseline's [90 % interval]; "
         f"below 1x for the checksum is its overhead; {PREDICTED_GAIN})",
         ["deployment", "baseline", "load", "what differs", "measured gain", "what it says", "predicted gain",
          "measured vs predicted"] + ([QUALITY_HEAD] if with_quality else []), gains),
    ]
    if with_quality:
        out.append(("Throughput and quality, each against the baseline", ["what changed", "at saturation and in "
                    "quality"], [[f"{g['deployment']} ({g['load']})", headline(g)] for g in m.gains]))
    if detail:
        out.insert(0, ("Conditions of each cell (rates and latencies in the modelled GPUs' time)",
                       ["cell", "model", "GPUs", "tp/dp/ep", "KV cache", "experts (weights)", "checksum",
                        "memory fraction", "flags", "workload", "SLO", "stage (modelled s measured)",
                        "twin (time scale)"],
                       [_conditions(c) for c in m.cells]))
        rows = [[c["cell"], str(p.get("repeat", 0) + 1), _f(p.get("rate")), "yes" if p.get("meets") else "no",
                 *(str(p.get(k, "-")) for k in ("sent", "completed", "missed", "cut_off", "errored")),
                 _f(p.get("ttft", p.get("ttft_p90"))), _f(p.get("tpot", p.get("tpot_p90"))),
                 f"p{c.get('percentile') or 90}", p.get("why") or ""]
                for c in m.cells for p in c.get("points") or []]
        out.append(("Every stage: every request sent is judged (cut off by the stage's end: a miss)",
                    ["cell", "repeat", "req/s", "within the SLO", "sent", "completed", "missed", "of which cut off",
                     "errored", "TTFT s", "TPOT s", "at (the SLO's percentile)", "why not"], rows))
    return out


QUALITY_HEAD = "quality vs the baseline (B - A points [90 %], problems, gate: no drop > 2 points)"


def headline(g: dict) -> str:
    """'FP8 KV: 1.52x [1.46-1.60] at saturation; HumanEval -0.6 points [-2.4, +1.2] (n=164, passed)'."""
    gain = "not measured: host too busy" if g.get("busy") else \
        _fi(g["measured_gain"], g.get("gain_interval"), ".2f", "x") + " at saturation"
    return f"{g.get('change', g['what'])}: {gain}; {g.get('quality') or 'quality not measured'}"


def _conditions(c: dict) -> list[str]:
    par = c.get("parallel") or {}
    return [c["cell"], str(c.get("model") or "-"), f"{c.get('gpus', '-')}x {c.get('gpu', '-')}",
            f"{par.get('tp', c.get('gpus', '-'))}/{par.get('dp', 1)}/{par.get('ep', 1)}", str(c.get("kv_dtype", "-")),
            str(c.get("weights", "-")), str(c.get("kv_checksum", "-")), _f(c.get("mem_fraction")),
            " ".join(map(str, c.get("flags") or [])) or "-",
            str(c.get("workload", "-")), str(c.get("slo", "-")), _f(c.get("stage_s")),
            f"{c['twin']} (x{c.get('time_scale', 1):g} time)" if c.get("twin") else "-"]


def _behind(c: dict) -> str:
    """A twin that could not keep up with its modelled pace, said beside its figure (bench/campaign/stage.py)."""
    said = behind_said(c.get("twin_behind"))
    return f"; at its worst stage {said}" if said else ""


def _first_line(text: str | None) -> str:
    """A cell's error in one line (a running or pending cell has none yet)."""
    return next(iter((text or "").splitlines()), "")[:90]


def campaign_html(m: Matrix) -> str:
    parts = [f"<h1>Campaign {html.escape(m.name)}</h1>"]
    for title, head, rows in campaign_sections(m, detail=True):
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>"
                     + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
                     + "</table>")
    from bench.report.curves import curves_html

    parts.append(curves_html(m.cells))
    for c in m.cells:
        if c["status"] == "failed" and c.get("log"):
            parts.append(f"<h3>{html.escape(c['cell'])}: server log (last lines)</h3>"
                         f"<pre>{html.escape(c['log'])}</pre>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "th,td{border:1px solid #ccc;padding:.3em .6em}td{text-align:right}td:first-child{text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{''.join(parts)}" \
           "</body></html>"


def write_campaign(m: Matrix, out: str | Path) -> Path:
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    with replacing(p) as tmp:
        tmp.write_text(campaign_html(m))
    return p


def campaign_list(con) -> list[dict]:
    """Every campaign, newest first, with its cells done: the queue (queued, running) and the finished ones."""
    rows = con.execute("""
        SELECT c.campaign_id, c.name, c.status, c.submitted_at, c.submitted_by, c.source,
               count(k.cell) FILTER (WHERE k.status = 'completed') AS completed,
               count(k.cell) FILTER (WHERE k.status = 'failed') AS failed
        FROM campaigns c LEFT JOIN campaign_cells k USING (campaign_id)
        GROUP BY ALL ORDER BY c.submitted_at DESC""").fetchall()
    keys = ("campaign_id", "name", "status", "submitted_at", "submitted_by", "source", "completed", "failed")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def run_stage(con, run_id: str) -> dict | None:
    """The campaign stage a run was (its cell, campaign, and the stage as the cell's result recorded it: rate, within
    the SLO or why not, sent / completed / missed / cut off / errored), or None for a run outside a campaign."""
    row = con.execute("SELECT json_extract_string(config, '$.campaign'), json_extract_string(config, '$.cell') "
                      "FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None or row[0] is None:
        return None
    found = con.execute("SELECT result FROM campaign_cells WHERE campaign_id = ? AND cell = ?", list(row)).fetchone()
    points = (json.loads(found[0]) if found and found[0] else {}).get("points") or []
    point = next((p for p in points if p.get("run_id") == run_id), None)
    return {"campaign": row[0], "cell": row[1], "point": point}


def live_cell(con, campaign_id: str, window_s: float = 10.0) -> dict | None:
    """The cell running now and its newest run over the last `window_s` seconds of requests (of the run's own clock):
    requests so far, requests finished per second, TTFT and TPOT p50/p90, all in the modelled GPUs' time (a twin's
    rates divided by its time scale, its latencies multiplied), like the offered rate beside them."""
    cell = con.execute("SELECT cell, started_at FROM campaign_cells WHERE campaign_id = ? AND status = 'running' "
                       "ORDER BY started_at DESC LIMIT 1", [campaign_id]).fetchone()
    if cell is None:
        return None
    run = con.execute("SELECT run_id, label, json_extract(config, '$.offered_rps'), "
                      "coalesce(json_extract(config, '$.time_scale')::DOUBLE, 1) FROM runs "
                      "WHERE json_extract_string(config, '$.campaign') = ? AND "
                      "json_extract_string(config, '$.cell') = ? ORDER BY started_at DESC LIMIT 1",
                      [campaign_id, cell[0]]).fetchone()
    out = {"cell": cell[0], "since": cell[1], "run_id": None, "label": None, "offered_rps": None, "requests": 0,
           "rate_rps": None, "ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None}
    if run is None:
        return out
    n, rate, t50, t90, p50, p90 = con.execute("""
        SELECT count(*), count(*) FILTER (WHERE finished_at >= max_t - ?) / ?,
               quantile_cont(ttft_s, 0.5), quantile_cont(ttft_s, 0.9), quantile_cont(tpot_s, 0.5),
               quantile_cont(tpot_s, 0.9)
        FROM (SELECT *, max(finished_at) OVER () AS max_t FROM requests WHERE run_id = ?)""",
                                              [window_s, window_s, run[0]]).fetchone()
    k = float(run[3])  # a twin's time scale: every figure below in the modelled GPUs' time, as the offered rate
    offered = float(run[2]) / k if run[2] not in (None, "null") else None

    def times(v: float | None) -> float | None:
        return None if v is None else v * k

    out.update(run_id=run[0], label=run[1], offered_rps=offered, requests=n, rate_rps=None if rate is None else
               rate / k, ttft_p50=times(t50), ttft_p90=times(t90), tpot_p50=times(p50), tpot_p90=times(p90),
               time_scale=k)
    return out
