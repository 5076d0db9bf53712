"""Quality as the reports and the Quality page show it: pass rates with their 90 % intervals, and B against A on
the same problems (bench/model/evidence/paired.py) grouped by model family and by what changed, from `capbench eval`
runs
with two targets and from campaign cells that carried an eval stage (each against its baseline's)."""

from __future__ import annotations

import json

from bench.model import Paired, drop_gate, paired_difference

FAMILIES = {"kimi": "Kimi K2 (MLA)", "deepseek": "DeepSeek-V3 (MLA)", "glm": "GLM-4.x (GQA)", "qwen": "Qwen",
            "other": "other"}
SUITE_NAMES = {"humaneval": "HumanEval", "bfcl-simple": "BFCL simple", "bfcl-multiple": "BFCL multiple",
               "bfcl-parallel": "BFCL parallel", "bfcl-multi-turn": "BFCL multi-turn",
               "retrieval": "retrieval 32k-120k"}
MAX_DROP = 2.0  # points: the gate "no drop larger than 2 points"
TWIN_NOTE = ("a twin answers synthetic text, not a model's: these figures measure the twin's text generator, "
             "never a model's quality")


def family(model: str | None) -> str:
    """A served model name or a catalog id as its family's label (the attention it caches: MLA or GQA)."""
    name = (model or "").lower()
    return next((label for key, label in FAMILIES.items() if key in name), FAMILIES["other"])


def change(cell: dict, base: dict, kv_scales: bool = False) -> str:
    """What a deployment changes against its baseline, in the words the per-change table groups by."""
    parts = []
    if str(cell.get("kv_dtype")).startswith("fp8") and cell.get("kv_dtype") != base.get("kv_dtype"):
        parts.append("FP8 KV, calibrated scales" if kv_scales else "FP8 KV, scale 1.0")
    w = str(cell.get("weights"))
    if w != str(base.get("weights")):
        parts.append("INT4 experts" if w.startswith("int4") else "FP8 experts" if w == "fp8" else f"{w} experts")
    if cell.get("kv_checksum") != base.get("kv_checksum"):
        parts.append(f"KV checksum {cell.get('kv_checksum')}")
    return " + ".join(parts) or "same configuration"


def rate_said(side: dict) -> str:
    """'81.7 % [76.1-86.3] of 164' as every table writes a pass rate."""
    if side.get("pass_rate") is None:
        return "-"
    lo, hi = side["interval"]
    return f"{side['pass_rate']:.1f} % [{lo:.1f}-{hi:.1f}] of {side['scored']}"


def outcomes(con, run_id: str, side: str = "A") -> dict[tuple[str, str], bool]:
    """(suite, problem) -> passed, for one side of an eval run; errors and not-run problems left out."""
    rows = con.execute("SELECT suite, problem_id, outcome = 'passed' FROM eval_answers WHERE run_id = ? AND side = ? "
                       "AND outcome IN ('passed', 'failed')", [run_id, side]).fetchall()
    return {(s, p): ok for s, p, ok in rows}


def paired_by_suite(a: dict, b: dict) -> dict[str, Paired]:
    """B against A on each suite's problems both scored."""
    out = {}
    for suite in sorted({s for s, _ in a} & {s for s, _ in b}):
        keys = sorted(k for k in a.keys() & b.keys() if k[0] == suite)
        if keys:
            out[suite] = paired_difference([a[k] for k in keys], [b[k] for k in keys])
    return out


def _row(fam: str, what: str, suite: str, p: Paired, source: str, max_drop: float) -> dict:
    v = drop_gate(p, max_drop)
    return {"family": fam, "change": what or "unspecified", "suite": SUITE_NAMES.get(suite, suite), "problems": p.n,
            "A pass rate": f"{p.a_rate:.1f} %", "B pass rate": f"{p.b_rate:.1f} %", "B - A [90 %]": p.said(),
            "McNemar p": f"{p.p_value:.3g}", "gate": v.words, "verdict": v.status, "source": source,
            "diff": p.diff, "low": p.low, "high": p.high}


def ab_rows(con, max_drop: float = MAX_DROP) -> list[dict]:
    """Every A/B comparison in the DB, one row per suite: `capbench eval` runs with two targets, and campaign cells
    with an eval stage against their baseline's. Sorted by family, change and suite."""
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'eval_answers'"
                       ).fetchone()[0]:
        return []
    rows = []
    for run_id, config in con.execute("SELECT run_id, config FROM runs WHERE profile = 'eval' AND status = "
                                      "'completed' ORDER BY started_at").fetchall():
        c = json.loads(config or "{}")
        if len(c.get("targets") or []) != 2 or c.get("campaign"):
            continue
        for suite, p in paired_by_suite(outcomes(con, run_id, "A"), outcomes(con, run_id, "B")).items():
            rows.append(_row(family((c.get("models") or [None])[0]), c.get("change", ""), suite, p,
                             f"eval run {run_id}" + (" (twin: not a model)" if c.get("twin") else ""), max_drop))
    for q in cell_pairs(con, max_drop):
        rows.append(_row(q["family"], q["change"], q["suite"], q["paired"], f"campaign {q['campaign']} "
                         f"{q['cell']}" + (" (twin: not a model)" if q["twin"] else ""), max_drop))
    return sorted(rows, key=lambda r: (r["family"], r["change"], r["suite"]))


def cell_pairs(con, max_drop: float = MAX_DROP, campaign_id: str | None = None) -> list[dict]:
    """Each campaign cell with an eval stage against its baseline's cell of the same load, per suite."""
    cells = con.execute("SELECT campaign_id, cell, deployment, load, result FROM campaign_cells WHERE status = "
                        "'completed' AND (? IS NULL OR campaign_id = ?)", [campaign_id, campaign_id]).fetchall()
    done = {(c, d, x): json.loads(r) for c, _, d, x, r in cells if r}
    out = []
    for (cid, dep, load), r in done.items():
        base = done.get((cid, r.get("baseline"), load))
        if not base or not r.get("quality") or not base.get("quality"):
            continue
        q, bq = r["quality"], base["quality"]
        for suite, p in paired_by_suite(outcomes(con, bq["run_id"]), outcomes(con, q["run_id"])).items():
            out.append({"campaign": cid, "cell": f"{dep}/{load}", "deployment": dep, "load": load,
                        "family": family(r.get("model")), "change": change(r, base, q.get("kv_scales", False)),
                        "suite": suite, "paired": p, "twin": bool(r.get("twin"))})
    return out


def quality_beside(gain: dict, pairs: list[dict]) -> str:
    """The quality of one gain's deployment against its baseline, as the campaign report writes it beside the
    gain: 'HumanEval -0.6 points [-2.4, +1.2]; BFCL multi-turn -1.1 points [-3.0, +0.8]'; '-' without an eval."""
    mine = [q for q in pairs if q["deployment"] == gain["deployment"] and q["load"] == gain["load"]]
    said = "; ".join(f"{SUITE_NAMES.get(q['suite'], q['suite'])} {q['paired'].said()} (n={q['paired'].n}, "
                     f"{drop_gate(q['paired']).status})" for q in mine) or "-"
    return said + (" (answered by twins: synthetic text, not a model's quality)" if any(q["twin"] for q in mine)
                   else "")


def runs_table(con) -> list[dict]:
    """Every eval run, per suite and side: the pass rate with its 90 % interval, unparsed tool calls, errors."""
    from scipy import stats

    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'eval_answers'"
                       ).fetchone()[0]:
        return []
    rows = con.execute("""
        SELECT a.run_id, any_value(r.label), any_value(r.config), a.side, any_value(a.target), a.suite,
               count(*) FILTER (WHERE outcome IN ('passed', 'failed')), count(*) FILTER (WHERE outcome = 'passed'),
               count(*) FILTER (WHERE outcome = 'error'), count(*) FILTER (WHERE outcome = 'not_run'),
               count(*) FILTER (WHERE unparsed AND outcome IN ('passed', 'failed'))
        FROM eval_answers a LEFT JOIN runs r USING (run_id)
        GROUP BY a.run_id, a.side, a.suite ORDER BY min(r.started_at) DESC, a.run_id, a.suite, a.side""").fetchall()
    out = []
    for run_id, label, config, side, target, suite, scored, passed, errors, not_run, unparsed in rows:
        c = json.loads(config or "{}")
        ci = stats.binomtest(passed, scored).proportion_ci(0.90, method="wilson") if scored else None
        data = (c.get("suites") or {}).get(suite) or {}
        out.append({"run": run_id, "label": label, "side": side, "target": target,
                    "suite": SUITE_NAMES.get(suite, suite), "family": family((c.get("models") or [None])[0]),
                    "pass rate [90 %]": rate_said({"pass_rate": 100 * passed / scored if scored else None,
                                                   "interval": [100 * ci.low, 100 * ci.high] if ci else None,
                                                   "scored": scored}),
                    "unparsed": f"{unparsed / scored:.1%}" if scored and suite.startswith("bfcl") else "-",
                    "endpoint errors": errors, "not run (sandbox)": not_run,
                    "data": f"{data.get('package', '?')} {data.get('version', '')} sha256 "
                            f"{str(data.get('sha256', ''))[:12]}", "twin": bool(c.get("twin"))})
    return out


def positions_table(con) -> list[dict]:
    """Long generations per run and answer position: agreement, mean KL, answers that part there."""
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'eval_positions'"
                       ).fetchone()[0]:
        return []
    rows = con.execute("""
        SELECT run_id, bin, min(bin_start), sum(positions), sum(agreed),
               sum(mean_kl * kl_positions) / nullif(sum(kl_positions) FILTER (WHERE mean_kl IS NOT NULL), 0),
               count(first_divergence)
        FROM eval_positions GROUP BY run_id, bin ORDER BY run_id, min(bin_start)""").fetchall()
    return [{"run": r, "answer tokens": b, "positions": n, "token agreement": f"{agreed / n:.1%}" if n else "-",
             "mean KL (nats)": "-" if kl is None else f"{kl:.4f}", "answers parting here": parted}
            for r, b, _, n, agreed, kl, parted in rows]


def interval_chart(rows: list[dict]):
    """B - A per family, change and suite with its 90 % interval, the gate's -2 points drawn."""
    import altair as alt
    import pandas as pd

    df = pd.DataFrame([{"what": f"{r['family']} | {r['change']} | {r['suite']} ({r['problems']}) | {r['source']}",
                        "diff": r["diff"], "low": r["low"], "high": r["high"], "verdict": r["verdict"]} for r in rows])
    base = alt.Chart(df).encode(y=alt.Y("what:N", title=None, axis=alt.Axis(labelLimit=560)))
    color = alt.Color("verdict:N", title="gate", scale=alt.Scale(domain=["passed", "inconclusive", "failed"],
                                                                 range=["#2e7d32", "#9e9e9e", "#c62828"]))
    bars = base.mark_rule(strokeWidth=3).encode(x=alt.X("low:Q", title="B - A, points (90 % interval)"), x2="high:Q",
                                                color=color)
    dots = base.mark_point(filled=True, size=60).encode(x="diff:Q", color=color,
                                                        tooltip=["what", "diff", "low", "high", "verdict"])
    bar = alt.Chart(pd.DataFrame({"x": [-MAX_DROP]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
    return (bars + dots + bar).properties(title="Quality: B against A on the same problems")
