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
    from bench.report.campaign import _gains, gain_said

    clear = _gains([_cell("b", None, [1.0, 1.05, 0.95], "bf16"), _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3")])[0]
    lo, hi = clear["gain_interval"]
    assert lo < clear["measured_gain"] < hi and lo > 1.0 and clear["verdict"] == "a gain"
    blur = _gains([_cell("b", None, [1.0, 1.2, 0.9], "bf16"), _cell("f", "b", [1.1, 0.95, 1.2], "fp8_e4m3")])[0]
    assert blur["verdict"] == "not distinguishable from no gain"
    assert "behind" not in gain_said(clear)  # twins that kept their pace: nothing to add
    lagging = _cell("f", "b", [2.0, 2.1, 1.9], "fp8_e4m3") | {"twin_behind": 0.15}
    late = _gains([_cell("b", None, [1.0, 1.05, 0.95], "bf16") | {"twin_behind": 0.03}, lagging])[0]
    assert late["twin_behind"] == 0.15 and "a twin fell 15% of a stage behind" in gain_said(late)
    assert "measure again on a quiet host" in gain_said(late)
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
