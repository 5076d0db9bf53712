"""The campaign report stands alone: latency against load per (load, figure) with the measured stages, the model's
curve for the same cell and its 80 % band on the same axes, and the SLO's bound; the conditions block is complete."""

import re

from bench.campaign import parse_campaign
from bench.campaign.predict import mem_fraction, predicted
from bench.campaign.run import _search
from bench.report import Matrix, campaign_html
from bench.report.curves import campaign_curves, curve_rows

SPEC = ("name: p\nslo: \"ttft=30s,tpot=300ms,p=50\"\nduration: 2\ndeployments:\n"
        "  - {name: glm, twin: 'glm-4.6@h200x8,kv=bf16,time_scale=10'}\n"
        "loads:\n  - {name: lc, workload: campaign-long-context, sweep: {start: 0.2}}\n")


def test_the_model_records_its_curve_at_the_slo_percentile_with_a_band():
    c = parse_campaign(SPEC)
    dep, load = c.deployments[0], c.loads[0]
    p = predicted(dep, load, _search(load))
    curve = p["predicted_curve"]
    assert p["percentile"] == 50 and len(curve) >= 3
    rates = [x["rate"] for x in curve]
    assert rates == sorted(rates) and rates[0] == 0.2
    for x in curve:
        assert x["ttft_low"] < x["ttft"] < x["ttft_high"] and x["tpot_low"] < x["tpot"] < x["tpot_high"]
    assert curve[-1]["ttft"] > curve[0]["ttft"]  # latency climbs with load
    assert 0.5 < mem_fraction(dep) < 1


def _cell(dep: str, pred_scale: float) -> dict:
    points = [{"repeat": 0, "rate": r, "meets": r < 1, "why": "" if r < 1 else "TTFT p50 40 s > 30 s", "sent": 10,
               "completed": 10, "missed": 0, "cut_off": 0, "errored": 0, "ttft": t, "tpot": 0.05 * r + 0.02}
              for r, t in ((0.2, 2.0), (0.4, 5.0), (1.2, 40.0))]
    points.append({"repeat": 0, "rate": 2.0, "meets": False, "why": "cut off", "sent": 10, "completed": 2,
                   "missed": 8, "cut_off": 8, "errored": 0, "ttft": None, "tpot": None})
    curve = [{"rate": r, "ttft": t * pred_scale, "ttft_low": t * pred_scale * 0.7, "ttft_high": t * pred_scale * 1.4,
              "tpot": 0.04, "tpot_low": 0.03, "tpot_high": 0.05} for r, t in ((0.2, 1.5), (0.6, 6.0), (1.5, 60.0))]
    return {"cell": f"{dep}/lc", "deployment": dep, "load": "lc", "status": "completed", "measured_rps": 0.4,
            "model": "glm-4.6", "gpu": "h200", "gpus": 8, "kv_dtype": "bf16", "weights": "native",
            "kv_checksum": "off", "mem_fraction": 0.68, "flags": [], "workload": "campaign-long-context",
            "slo": "ttft=30s,tpot=300ms,p=50", "percentile": 50, "twin": "twin:glm-4.6@h200x8", "time_scale": 10,
            "stage_s": 30.0, "points": points, "predicted_curve": curve}


def test_rows_and_charts_per_load_and_figure():
    cells = [_cell("bf16", 1.0), _cell("fp8", 0.6)]
    df = curve_rows(cells)
    assert set(df.figure) == {"TTFT p50 (s)", "TPOT p50 (ms)"}
    measured = df[(df.source == "measured") & (df.figure == "TTFT p50 (s)")]
    assert sorted(measured.verdict.value_counts().items()) == [
        ("cut off (past every bound)", 2), ("stage missed the SLO", 2), ("stage within the SLO", 4)]
    tpot = df[(df.source == "predicted") & (df.figure == "TPOT p50 (ms)")]
    assert tpot.value.tolist()[0] == 40.0 and tpot.low.tolist()[0] == 30.0  # seconds -> ms, band with it
    titles = [t for t, _ in campaign_curves(cells)]
    assert titles == ["lc: TTFT p50 (s) against offered rate", "lc: TPOT p50 (ms) against offered rate"]


def test_the_html_report_draws_them_inline_with_the_slo_and_the_conditions():
    m = Matrix("c1", "study", "completed", [_cell("bf16", 1.0), _cell("fp8", 0.6)])
    page = campaign_html(m)
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    assert "SLO 30" in svgs[0] and "SLO 300" in svgs[1]  # the bound, in the chart's unit
    assert "bf16" in svgs[0] and "fp8" in svgs[0] and "within the SLO" in svgs[0]
    assert "http" not in page.replace("http://www.w3.org", "")  # stands alone: nothing fetched
    assert "<script" not in page
    assert "<td>2</td><td>0.03</td><td>p50</td>" in page  # a stage's TTFT and TPOT at the SLO's percentile
    for word in ("memory fraction", "experts (weights)", "tp/dp/ep", "twin (time scale)", "0.68", "8x h200",
                 "campaign-long-context", "(x10 time)", "stage (modelled s measured)"):
        assert word in page, word
    assert "<td>30</td><td>twin:glm-4.6@h200x8 (x10 time)</td>" in page  # a figure is of its window: it is shown
