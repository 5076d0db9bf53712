"""Under an address-space limit (`ulimit -v`), vl-convert's V8 cannot start (it traps: SIGTRAP, the process gone).
`capbench report` then draws every chart with matplotlib from the chart's own Vega-Lite spec, says so on stderr
and under each chart, and exits 0; the campaign report (the dashboard's and serve's download) too."""

import re
import subprocess
import sys
from pathlib import Path

from bench.report import Matrix, campaign_html, static_charts

sys.path.insert(0, str(Path(__file__).parent))
from test_campaign_curves import _cell  # noqa: E402

CAPBENCH = str(Path(sys.executable).parent / "capbench")
LIMIT_KB = 8_000_000  # 8 GB: far more than a report needs, far less than V8 reserves


def _capped(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"ulimit -v {LIMIT_KB}; exec {cmd}"], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_vl_convert_itself_traps_under_the_limit(tmp_path):
    """The reason for all this: the same conversion, unprotected, dies by SIGTRAP (-5)."""
    out = _capped(f"{sys.executable} -c \"{static_charts._PROBE}\"", tmp_path)
    assert out.returncode in (-5, 133), out.returncode


def test_the_report_draws_its_charts_without_v8_and_says_so(tmp_path):
    out = _capped(f"{CAPBENCH} report --db none --out r.html", tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "drawn without V8" in out.stderr and out.stderr.count("drawn without V8") == 1
    page = (tmp_path / "r.html").read_text()
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) >= 5 and all(static_charts.NOTE.split(" (")[0] in s for s in svgs)
    assert "<script" not in page


def test_the_campaign_report_too(monkeypatch):
    monkeypatch.setattr(static_charts, "v8_usable", lambda: False)
    page = campaign_html(Matrix("c1", "study", "completed", [_cell("bf16", 1.0), _cell("fp8", 0.6)]))
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2 and all("drawn without V8" in s for s in svgs)
    assert "bf16" in svgs[0] and "fp8" in svgs[0] and "<script" not in page


def test_without_a_limit_vl_convert_draws_them():
    assert static_charts.v8_usable()  # the test process has no address-space limit: no probe, no fallback
