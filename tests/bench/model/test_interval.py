"""The 80 % intervals every predicted figure carries: calibrated on the corpus's out-of-sample errors, checked the
way they are used (a source the intervals never saw), wider where the evidence is thin, and said in words where
there is none."""

import json
import math
import os
import subprocess
import sys

import pytest

from bench.model import interval


def test_shipped_intervals_cover_75_to_85_percent_of_left_out_sources_per_figure():
    cov = interval.coverage()
    assert set(cov) == set(interval.FIGURES)
    for figure, c in cov.items():
        assert c["cases"] >= 70, figure
        assert 0.75 <= c["coverage"] <= 0.85, f"{figure}: {c['coverage']:.0%} of left-out cases inside"
        assert sum(n for _, n in c["by_regime"].values()) == c["cases"]


def test_the_shipped_widths_are_what_calibration_gives():
    assert interval.calibrate() == interval.WIDEN


def test_unwidened_quantiles_undercover_which_is_why_the_width_is_calibrated():
    narrow = interval.coverage(widen=dict.fromkeys(interval.FIGURES, 0.6))
    assert any(c["coverage"] < 0.75 for c in narrow.values())


def test_a_regime_without_cases_is_wider_and_said_in_words():
    rich = interval.regime("deepseek-r1", "h200", "native", 32)
    none = interval.regime("kimi-k2-thinking", "b200", "native", 32)
    for figure in interval.FIGURES:
        a, b = interval.band(figure, rich), interval.band(figure, none)
        assert b.cases == 0 < a.cases
        assert b.low < a.low <= 1 <= a.high < b.high or b.low < a.low and a.high < b.high
    assert interval.evidence(rich) is None
    words = interval.evidence(none)
    assert words.startswith("no published evidence for INT4 experts, MLA on Blackwell") and "campaign file" in words


def test_a_regime_whose_own_cases_fall_outside_is_said_in_words():
    """A regime whose own left-out cases fall on one side of the pooled band says so (rows made for the test)."""
    reg = interval.regime("kimi-k2-thinking", "h200", "native", 32)
    rows = list(interval.shipped_rows())
    slow = [interval.Row(f"made/{k}", "made", reg, {"output_tok_s": -1.5}) for k in range(6)]
    words = interval.evidence(reg, tuple(rows + slow))
    assert words and "published cases of INT4 experts, MLA on Hopper delivered throughput slower" in words
    assert interval.evidence(interval.regime("deepseek-r1", "b200", "native", 32)) is None


def test_a_regime_with_runs_left_out_as_anomalous_says_how_many():
    """Kimi K2.5 on 8x H200 (INT4 experts): five cookbook runs whose best second was 2.8-6.6x their mean are left
    out (data/calibration/outliers.yaml); the three one-request runs remain, too few for the regime's own band."""
    words = interval.evidence(interval.regime("kimi-k2-thinking", "h200", "native", 32))
    assert words.startswith("only 3 published cases for INT4 experts, MLA on Hopper (they delivered ")
    assert "the predicted throughput); 5 more published runs of it are left out of the evidence" in words
    assert "measure before buying" in words


def test_a_thin_regime_says_what_its_own_cases_delivered():
    """AMD's two stock runs of Kimi K2.5 (INT4 experts) on 8x MI300X came in at 0.82x and 0.91x of the prediction
    made without them (0.64x and 0.75x before MI300X had its own roofline_scale): a plan for that regime says so,
    beside 'only 2 published cases', and counts the two FlyDSL runs as left out."""
    words = interval.evidence(interval.regime("kimi-k2.5", "mi300x", "native", 32))
    assert words.startswith("only 2 published cases for INT4 experts, MLA on MI300X (they delivered 0.82-0.91x the "
                            "predicted throughput); 2 more published runs of it are left out"), words


def test_the_band_brackets_the_prediction_as_published_over_predicted():
    lo, hi = interval.predicted_range("glm-4.6", "b200", "native", "output_tok_s", 1000.0, 64)
    assert lo < 1000.0 < hi
    reg = interval.regime("glm-4.6", "b200", "native", 64)
    rows = interval.shipped_rows()
    fewer = [r for r in rows if r.regime.kind != reg.kind] + [r for r in rows if r.regime.kind == reg.kind][:2]
    a, b = interval.band("output_tok_s", reg, rows), interval.band("output_tok_s", reg, fewer)
    assert b.cases == 2 < a.cases and b.high / b.low > a.high / a.low  # fewer cases of the regime: wider


def test_validate_json_reports_coverage_per_regime():
    env = {**os.environ, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "validate", "--case",
                          "kimi-k2/", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cov = json.loads(out.stdout)["interval_coverage"]
    assert cov["output_tok_s"]["coverage"] == pytest.approx(interval.coverage()["output_tok_s"]["coverage"])
    assert any("MLA on Hopper" in k for k in cov["ttft_ms"]["by_regime"])


def test_an_all_at_once_burst_is_its_own_load_and_says_what_published_bursts_did():
    """GPUStack's 1000-prompt ShareGPT bursts are labelled 'all at once' (their own coverage row), not batch-bound;
    a burst's evidence counts the published bursts whose first token came later than the band allows."""
    from bench.model import corpus

    cases = {c.key: c for c in corpus.load()}
    burst = interval.case_regime(cases["gpustack-perf-lab-glm-4.6-h100/h100-tp8-fp8-sharegpt"])
    assert burst.load == "burst" and burst.label() == "FP8 experts, GQA on Hopper, all at once"
    capped = [c for c in cases.values() if c.workload and c.workload.max_concurrency and c.workload.max_concurrency > 4]
    assert capped and all(interval.case_regime(c).load == "batch" for c in capped)
    rows = interval.shipped_rows()
    own = [r for r in rows if r.regime.load == "burst" and r.regime.kind == burst.kind and "ttft_ms" in r.residual]
    high = interval.band("ttft_ms", burst).high
    later = sum(1 for r in own if r.residual["ttft_ms"] > math.log(high))
    assert len(own) >= interval.THIN and later >= 1  # GLM-4.6 FP8 on 8x H100: 5-8x the model's TTFT
    words = interval.burst_evidence(burst)
    assert words.startswith(f"in the {len(own)} published all-at-once bursts of FP8 experts, GQA on Hopper")
    assert f"({later} beyond this interval's upper end)" in words
    assert words in interval.evidence(burst)
    assert interval.evidence(interval.regime("glm-4.6", "h100-sxm", "fp8", 600)) is None  # not a burst: no words


def test_a_simulated_point_gets_throughput_and_cost_intervals_only_at_capacity():
    from bench.model import Deployment, catalog, fixed_workload
    from bench.model import simulate as sim

    dep = Deployment(catalog.model("glm-4.5-air"), catalog.gpu("h100-sxm"), 4, 1, "bf16", "native", None)
    wl = fixed_workload("1000", "200")
    below = sim.run(dep, wl, 2.0, 60, 0, None, 5)
    burst = sim.run(dep, wl, math.inf, 60, 0, None, 5)
    a = interval.for_point("glm-4.5-air", "h100-sxm", "native", below, 90, False)
    b = interval.for_point("glm-4.5-air", "h100-sxm", "native", burst, 90, True)
    assert "output_tps" not in a and "usd_per_m_output" not in a and a["burst_evidence"] is None
    lo, hi = a["ttft_s"]
    assert lo < below.ttft_p90 < hi
    lo, hi = b["output_tps"]
    assert lo < burst.output_tok_s < hi
    assert b["usd_per_m_output"] == pytest.approx((burst.usd_per_million * burst.output_tok_s / hi,
                                                    burst.usd_per_million * burst.output_tok_s / lo))
    assert b["regime"].endswith("all at once") and "published all-at-once bursts" in b["burst_evidence"]


def test_simulate_prints_and_gives_json_intervals_with_the_burst_evidence():
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    cli = [sys.executable, "-c", "from bench.cli import main; main()", "simulate", "--model", "glm-4.6", "--gpu",
           "h100-sxm", "--tp", "8", "--weights", "fp8", "--input-len", "200", "--output-len", "200", "--rate", "inf",
           "--num-requests", "200"]
    text = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=300)
    assert text.returncode == 0, text.stderr[-2000:]
    said = " ".join(text.stdout.split())  # the words under the table wrap at the first screen's 100 columns
    assert "[in brackets]: the 80% interval" in said
    assert "Evidence: in the" in said and "published all-at-once bursts" in said
    out = subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env, timeout=300)
    point = json.loads(out.stdout)[0]
    iv = point["interval"]
    assert iv["output_tps"][0] < point["output_tok_s"] < iv["output_tps"][1]
    assert f"{iv['output_tps'][0]:,.0f}-{iv['output_tps'][1]:,.0f}" in text.stdout.replace("\n", "")
    own = subprocess.run([*cli, "--compare-kv", "--calibration", "data/calibration/default.yaml"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert own.returncode == 0, own.stderr[-2000:]
    assert own.stdout.count("[in brackets]") == 1 and own.stdout.count("fp8_e4m3 (") == 1  # one row per KV dtype
    assert "The intervals measure the shipped factors' errors on the published corpus, not those of" in \
        " ".join(own.stdout.split())
