"""The first screen answers (bench/report/screen.py, the pattern `capbench plan` set): `capbench simulate` (a rate,
--compare-kv, --sweep), `capbench validate` and `capbench campaign`'s summary, run as users run them (the installed
capbench from a tmp folder); `capbench plan --details`'s tables fit too. At COLUMNS=100 the first 15 lines fit 100
columns and hold the answer; at COLUMNS=120 no line is wider than 120 and no name is split across lines (a table that
folds a cell continues the name on the next line, in the same column)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CAPBENCH = str(Path(sys.executable).parent / "capbench")
SIM = ["simulate", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--workload", "chat", "--num-requests", "100"]
SWEEP = [*SIM, "--sweep", "--compare-kv", "--min-seconds", "30"]


def _start(cwd: Path, columns: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([CAPBENCH, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"})


def _output(proc: subprocess.Popen, timeout: int = 600) -> str:
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    return stdout


def _capbench(cwd: Path, columns: int, *args: str, timeout: int = 600) -> str:
    return _output(_start(cwd, columns, *args), timeout)


def _first_screen(text: str) -> str:
    screen = [x for x in text.splitlines() if x.strip()][:15]
    assert all(len(x) <= 100 for x in screen), [x for x in screen if len(x) > 100]
    return "\n".join(screen)


def _split(name: str, lines: list[str]) -> list[str]:
    """Where `name` ends a cell on one line and goes on in the same column on the next (or a wrapped line's start)."""
    def ends(text: str, at: int) -> bool:  # a word ends at `at`
        return at >= len(text) or not (text[at].isalnum() or text[at] in "-_.")

    out = []
    for a, b in zip(lines, lines[1:], strict=False):
        for k in range(1, len(name)):
            head, tail = name[:k], name[k:]
            start = a.find(head)
            while start >= 0:
                if ends(a, start + k) and (start == 0 or a[start - 1] == " "):
                    at = start if b[start:].startswith(tail) else len(b) - len(b.lstrip()) if (
                        b.lstrip().startswith(tail) and not a[:start].strip()) else None
                    if at is not None and ends(b, at + len(tail)):
                        out.append(f"{a.rstrip()!r} / {b.rstrip()!r}")
                start = a.find(head, start + 1)
    return out


def _fits_120(text: str, names: list[str]) -> None:
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120, [x for x in lines if len(x) > 120]
    for name in names:
        assert any(name in x for x in lines), name  # whole on some line, not cut short
        assert not _split(name, lines), _split(name, lines)


def test_the_split_check_finds_a_folded_name():
    assert _split("fp8-block12", ["│ fp8-blo │ 3", "│ ck12    │  "])
    assert _split("fp8-block12", ["a fp8-", "  block12 b"])
    assert not _split("fp8-block12", ["│ fp8-block12 │ 3", "│ fp8-block12 │ 4"])


def test_simulate_at_a_rate_answers_on_the_first_screen(tmp_path):
    rate = [*SIM, "--rate", "2", "--compare-kv"]
    figures = json.loads(_capbench(tmp_path, 100, *rate, "--json"))
    screen = _first_screen(_capbench(tmp_path, 100, *rate))
    for p in figures:  # each KV dtype's row: throughput, latency at the SLO's percentile, cost, the SLO met
        row = next(x for x in screen.splitlines() if x.startswith(f"{p['kv_dtype']} ("))
        cells = row.split()
        assert f"{p['output_tok_s']:,.0f}" in cells and f"{p['ttft_p90']:,.2f}" in cells, row
        assert f"{p['tpot_p90'] * 1e3:,.0f}" in cells and f"{p['usd_per_million']:.2f}" in cells, row
        assert cells[-1] in ("yes", "no")
    assert "TTFT p90 s" in screen and "TPOT p90 ms" in screen and "More: --details" in screen
    details = _capbench(tmp_path, 120, *rate, "--details")
    _fits_120(details, ["bf16 (", "fp8_e4m3 (", "achieved req/s", "retracted", "glm-4.6"])
    for p in figures:  # --details holds the rest of each point
        assert f"{p['achieved_rps']:.2f}" in details and f"{p['cache_hit_rate']:.0%}" in details


def test_simulate_sweep_answers_with_the_highest_rates_first(tmp_path):
    sweeps = json.loads(_capbench(tmp_path, 100, *SWEEP, "--json"))
    screen = _first_screen(_capbench(tmp_path, 100, *SWEEP))
    flat = " ".join(screen.split())
    for s in sweeps:
        assert f"{s['kv_dtype']} KV: highest rate meeting" in flat
        assert s["best_rate"] is None or f"{s['best_rate']:.2f}" in flat
    assert "FP8 KV vs BF16 KV at the SLO" in flat and "More: --details" in flat
    _fits_120(_capbench(tmp_path, 120, *SWEEP, "--details"), ["all at once", "bf16 KV", "fp8_e4m3 KV", "glm-4.6"])


@pytest.mark.slow  # three replays of the corpus, ~40 s
def test_validate_answers_with_the_verdict_and_every_case_fits_120_columns(tmp_path):
    report = json.loads(_capbench(tmp_path, 100, "validate", "--json"))
    screen = _first_screen(_capbench(tmp_path, 100, "validate"))
    assert "Goals, judged" in screen and "80 % intervals" in screen and "More: --details" in screen
    for line in report["verdict"].splitlines():
        assert line.strip() in screen
    said = " ".join(screen.split())  # the bias by publisher, as --json has it, wrapped at 100 columns
    for b in (b for b in report["bias_by_publisher"] if b["cases"] >= 5):
        assert f"{b['org']} {b['ratio']['output_tok_s']:.2f}x ({b['cases']} cases)" in said
    assert "capbench calibrate" in said
    details = _capbench(tmp_path, 120, "validate", "--details")
    keys = [c["case"] for c in report["cases"]] + [c["case"] for c in report["disaggregated"]]
    names = {k.split("/", 1)[0] for k in keys} | {k.split("/", 1)[1] for k in keys if "/" in k}
    names |= {k for k in (c["case"] for c in report["disaggregated"])}
    _fits_120(details, sorted(names))


CAMPAIGN = """name: widths
slo: "ttft=10s,tpot=500ms"
duration: 1.0
deployments:
  - {name: glm-bf16, twin: "glm-4.6@h200x8,kv=bf16,time_scale=10"}
  - {name: glm-fp8-block12, twin: "glm-4.6@h200x8,kv=fp8_e4m3,time_scale=10", baseline: glm-bf16}
loads:
  - {name: chat, workload: chat, profile: poisson, rate: 1}
"""


@pytest.mark.slow  # two campaigns of two twins, side by side (each into its own DB), ~25 s
def test_campaign_summary_answers_with_the_gain_first(tmp_path):
    (tmp_path / "c.yaml").write_text(CAMPAIGN)
    first = _start(tmp_path, 100, "campaign", "c.yaml", "--db", "a.duckdb")
    second = _start(tmp_path, 120, "campaign", "c.yaml", "--db", "b.duckdb", "--details")
    out = _output(first)
    screen = _first_screen(out)
    flat = " ".join(screen.split())
    assert flat.startswith("Campaign widths (") and "2 cells, 2 completed" in flat
    assert "FP8 KV, glm-fp8-block12 vs glm-bf16, chat:" in flat and "predicted" in flat and "More: --details" in flat
    assert max(map(len, out.splitlines())) <= 120 and "glm-fp8-block12/chat" in out
    details = _output(second)
    _fits_120(details, ["glm-fp8-block12/chat", "glm-bf16/chat", "glm-fp8-block12", "glm-bf16", "FP8 KV"])
    assert "saturation / error:" in details and "what it says:" in details and "Each cell, the rest" in details


def test_plan_details_fit_120_columns_without_splitting_a_name(tmp_path):
    plan = ["plan", "--model", "glm-4.6", "--gpus", "h200", "--rate", "5", "--max-nodes", "1"]
    rows = json.loads(_capbench(tmp_path, 120, *plan, "--json"))["configurations"]
    details = _capbench(tmp_path, 120, *plan, "--details")
    words = {w.strip(",()") for r in rows for w in f"{r['gpu']} {r['short']}".split()} - {""}
    _fits_120(details, sorted(words) + ["--kv-cache-dtype", "--mem-fraction-static"])
    assert "★ h200" in details and "Rejected configurations" in details
