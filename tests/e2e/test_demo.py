"""The main job, shortened: the capacity tables, a campaign on twins swept to saturation, the store, the campaign
report with FP8 KV's measured and predicted gains, the capacity report; run twice, nothing is lost."""

import json
import subprocess
import sys

from bench import demo
from bench.store import Store

SMALL = """
name: demo-small
deployments:
  - {name: glm-bf16, twin: "glm-4.6@h200x8,kv=bf16,mem_fraction=0.7,time_scale=10"}
  - {name: glm-fp8, twin: "glm-4.6@h200x8,kv=fp8_e4m3,mem_fraction=0.7,time_scale=10", baseline: glm-bf16}
loads:
  - name: long-context
    workload: campaign-long-context
    slo: "ttft=30s,tpot=300ms"
    sweep: {start: 0.5, factor: 1.5, max_stages: 2, refine: 0, min_gain: 0}
"""


def test_short_demo_end_to_end_twice(tmp_path, capsys):
    db, report, spec = tmp_path / "capbench.duckdb", tmp_path / "reports" / "demo.html", tmp_path / "small.yaml"
    spec.write_text(SMALL)
    first = demo.run_demo(db, report, duration_s=2.0, campaign=str(spec))
    out = capsys.readouterr().out
    assert "What fits" in out and "highest rate within the SLO per cell" in out and "demo took" in out
    g = first["gains"][0]
    if g.get("busy"):  # a twin fell behind on a loaded host: the demo says so instead of quoting a gain
        assert "not measured: host too busy" in " ".join(out.split()) and g["seen_gain"] > 0
    else:
        assert "FP8 KV, glm-fp8 vs glm-bf16, long-context: measured" in out and "predicted" in out
    assert "no published pair of runs measures such a gain: it has no interval" in " ".join(out.split())
    assert report.is_file() and "<svg" in report.read_text()
    assert "Capacity report: GLM-4.6" in report.read_text()  # a section for the model the demo ran
    html = (tmp_path / "reports" / "demo-campaign.html").read_text()
    assert "glm-fp8/long-context" in html and "FP8 KV" in html
    assert {c["status"] for c in first["cells"]} == {"completed"} and len(first["cells"]) == 2
    assert (g["seen_gain"] if g.get("busy") else g["measured_gain"]) > 0 and g["predicted_gain"] > 0  # both served
    assert "bootstrap over" in g["gain_method"]  # one repeat: the gain's interval from the stages' requests
    assert g["gain_method"].endswith("paired: both were sent the same requests")  # the twins flush their caches
    for c in first["cells"]:  # and each cell's highest rate within the SLO, with how it was found
        lo, hi = c["measured_rps_interval"]
        assert c["interval_method"].startswith("90 % bootstrap over") and lo <= c["measured_rps"] <= hi
    runs = Store(db, read_only=True).runs()
    assert set(runs.status) == {"completed"} and (runs.requests > 0).all()
    with Store(db, read_only=True).connect() as con:
        kinds = {k for (k,) in con.execute("SELECT DISTINCT error_kind FROM requests WHERE status <> 'ok'").fetchall()}
    assert kinds <= {"cancelled"}  # only requests still running when a stage's time was up
    cells = {json.loads(c)["cell"] for c in runs.config}
    assert cells == {"glm-bf16/long-context", "glm-fp8/long-context"}
    demo.run_demo(db, report, duration_s=2.0, campaign=str(spec))
    assert len(Store(db, read_only=True).runs()) > len(runs)  # the first demo's runs are kept


def test_demo_rejects_a_bad_duration():
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "demo", "--duration", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--duration must be > 0" in out.stderr and "Traceback" not in out.stderr
