"""The campaign matrix while a campaign runs: cells with no result and no error yet are shown, not a traceback
(the dashboard's Campaigns page draws this every few seconds)."""

from bench.report import Matrix, campaign_html, campaign_sections


def test_a_running_campaign_with_pending_and_failed_cells_renders():
    m = Matrix("c1", "study", "running", cells=[
        {"cell": "glm/chat", "status": "running", "error": ""},
        {"cell": "glm/long", "status": "pending", "error": None},
        {"cell": "kimi/chat", "status": "failed", "error": "launch failed\nCUDA out of memory"},
    ])
    (_, _, cells), (_, _, gains) = campaign_sections(m)
    assert [r[0] for r in cells] == ["glm/chat", "glm/long", "kimi/chat"]
    assert cells[0][-1] == "" and cells[1][-1] == "" and cells[2][-1] == "launch failed"
    assert cells[0][2] == "-" and gains == []
    assert "glm/long" in campaign_html(m)


def _cell(dep: str, base: str | None, rates: list[float], kv: str) -> dict:
    from bench.model import mean_interval

    i = mean_interval(rates)
    return {"cell": f"{dep}/lc", "deployment": dep, "load": "lc", "status": "completed", "baseline": base,
            "measured_rps": i.value, "measured_rps_interval": [i.low, i.high], "repeats_rps": rates,
            "repeats": len(rates), "kv_dtype": kv, "weights": "native", "kv_checksum": "off", "model": "glm-4.6",
            "gpu": "h200", "gpus": 8, "workload": "campaign-long-context", "slo": "ttft=30s,p=90", "bracket": 0.04,
            "flags": ["--mem-fraction-static", "0.7"], "twin": None, "saturation": "SLO broke",
            "points": [{"repeat": 0, "rate": rates[0], "meets": True, "sent": 20, "completed": 18, "missed": 3,
                        "cut_off": 2, "errored": 0, "ttft_p90": 12.0, "tpot_p90": 0.05, "why": ""}]}


def test_gains_carry_their_interval_and_say_when_they_are_not_distinguishable_or_a_twin_fell_behind():
    from bench.report.campaign import _gains, gain_said, half_width

    clear = _gains([_cell("b", None, [1.0, 1.05, 0.95], "bf16"), _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3")])[0]
    lo, hi = clear["gain_interval"]
    assert lo < clear["measured_gain"] < hi and lo > 1.0 and clear["verdict"] == "a gain"
    blur = _gains([_cell("b", None, [1.0, 1.2, 0.9], "bf16"), _cell("f", "b", [1.1, 0.95, 1.2], "fp8_e4m3")])[0]
    assert blur["verdict"] == "not distinguishable from no gain"
    assert "behind" not in gain_said(clear)  # twins that kept their pace: nothing to add
    # a twin behind by more than the 5 % that counts, but by less than the gain's interval is wide: said beside it
    half = half_width(clear)
    assert 0.07 < half < 0.2
    lagging = _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3") | {"twin_behind": 0.06}
    late = _gains([_cell("b", None, [1.0, 1.05, 0.95], "bf16") | {"twin_behind": 0.03}, lagging])[0]
    assert late["twin_behind"] == 0.06 and "a twin fell 6% of a stage behind" in gain_said(late)
    assert "measure again on a quiet host" in gain_said(late) and late["measured_gain"] == clear["measured_gain"]


def test_a_gain_whose_twin_fell_further_behind_than_its_interval_is_wide_is_not_measured():
    """Kimi agentic FP8 1.52x [1.46-1.60], then 1.15x 35 minutes later on a busier host: a twin that lost more of a
    stage than the gain's interval's half-width measured the host, not FP8: no gain is quoted."""
    from bench.report.campaign import _gains, gain_said, half_width

    base = _cell("b", None, [1.0, 1.05, 0.95], "bf16")
    clear = _gains([base, _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3")])[0]
    lag = half_width(clear) + 0.02
    busy = _gains([base, _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3") | {"twin_behind": lag}])[0]
    assert busy["measured_gain"] is None and busy["gain_interval"] == [None, None] and busy["error"] is None
    assert busy["verdict"].startswith("not measured: host too busy") and busy["seen_gain"] == clear["measured_gain"]
    assert f"more than its interval's half-width, {half_width(clear):.0%}" in busy["verdict"]
    assert gain_said(busy) == busy["verdict"] and "a gain" not in gain_said(busy)
    # one run each: no interval, so any lag past the 5 % that counts makes it unmeasured
    one = _gains([_cell("b", None, [1.0], "bf16"), _cell("f", "b", [2.0], "fp8_e4m3") | {"twin_behind": 0.06}])[0]
    assert one["verdict"].startswith("not measured: host too busy") and one["measured_gain"] is None
    m = Matrix("c1", "study", "completed", [base, _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3")
                                            | {"twin_behind": lag}])
    m.gains = _gains(m.cells)
    (_, _, _), (_, _, rows) = campaign_sections(m)
    assert rows[0][4] == "not measured" and rows[0][5].startswith("not measured: host too busy")
    assert "x [" not in rows[0][4]
    m = Matrix("c1", "study", "completed", [_cell("b", None, [1.0, 1.2, 0.9], "bf16"),
                                            _cell("f", "b", [1.1, 0.95, 1.2], "fp8_e4m3")])
    m.gains = _gains(m.cells)
    html = campaign_html(m)
    # the standalone report: conditions, the stage's counts, the gain with its interval and its words
    assert "Conditions of each cell" in html and "--mem-fraction-static 0.7" in html and "8x h200" in html
    assert "<td>20</td><td>18</td><td>3</td><td>2</td><td>0</td>" in html
    assert "not distinguishable from no gain" in html and "x [" in html


def test_the_predicted_cost_carries_the_rates_interval_and_the_predicted_gain_says_it_has_none():
    """$ per 1M output tokens is the rate's inverse: its 80 % interval runs from the rate's high end to its low end;
    a predicted gain is a ratio of two predictions sharing one regime's error, so it is said to have no interval."""
    from bench.report.campaign import PREDICTED_GAIN, _gains

    base = _cell("b", None, [1.0, 1.05, 0.95], "bf16") | {
        "predicted_rps": 1.0, "predicted_rps_low": 0.5, "predicted_rps_high": 1.6, "predicted_usd_per_m": 8.0}
    fp8 = _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3") | {"predicted_rps": 2.0, "predicted_usd_per_m": 4.0}
    m = Matrix("c1", "study", "completed", [base, fp8])
    m.gains = _gains(m.cells)
    (_, head, cells), (title, _, gains) = campaign_sections(m)
    usd = head.index("predicted $/1M out (80 %)")
    assert cells[0][usd] == "8.00 (5.00-16.00)"  # 8 x 1.0 / 1.6 .. 8 x 1.0 / 0.5
    assert cells[1][usd] == "4.00"  # no rate interval given: no cost interval
    assert PREDICTED_GAIN in title and gains[0][6] == "2.00x"


def test_the_campaign_report_a_user_writes_says_not_measured(tmp_path):
    """`capbench report --campaign ID` (the installed CLI, from a tmp folder) for a campaign whose FP8 twin fell 20 %
    of a stage behind against a +-10 % gain: the page says "not measured: host too busy", quotes no gain."""
    import subprocess
    from pathlib import Path

    from bench.campaign import parse_campaign, record
    from bench.store import Store

    spec = ("name: busy\nslo: \"ttft=30s,p=90\"\nduration: 2\ndeployments:\n"
            "  - {name: b, twin: 'glm-4.6@h200x8,kv=bf16,time_scale=10'}\n"
            "  - {name: f, baseline: b, twin: 'glm-4.6@h200x8,kv=fp8_e4m3,time_scale=10'}\n"
            "loads:\n  - {name: lc, workload: campaign-long-context, sweep: {start: 0.2}}\n")
    db = tmp_path / "c.duckdb"
    store = Store(db)
    cid = record.new_campaign(store, parse_campaign(spec), "test", status="running")
    for cell in (_cell("b", None, [1.0, 1.05, 0.95], "bf16"),
                 _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3") | {"twin_behind": 0.2}):
        record.start_cell(store, cid, cell["cell"], cell["deployment"], "lc")
        record.finish_cell(store, cid, cell["cell"], "completed", cell)
    record.set_status(store, cid, "completed")
    exe = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "capbench"
    out = subprocess.run([str(exe), "report", "--campaign", cid, "--db", str(db), "--out", "r.html"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert "not measured: host too busy (a twin fell 20% of a stage behind" in page
    assert "a gain<" not in page and "2.00x [" not in page
