"""The main job, shortened: twins, load tests, the store, the report and the summary, run twice."""

import subprocess
import sys

from bench import demo
from bench.store import Store


def test_short_demo_end_to_end_twice(tmp_path, capsys):
    db, report = tmp_path / "capbench.duckdb", tmp_path / "reports" / "demo.html"
    configs = [c for c in demo.CONFIGS if c.model == "glm-4.6"]
    loads = [demo.LOADS[0], demo.LOADS[2]]
    first = demo.run_demo(db, report, duration_s=3.0, configs=configs, loads=loads)
    out = capsys.readouterr().out
    assert "What FP8 KV and INT4 experts buy" in out and "GLM-4.6, FP8 KV" in out and "demo took" in out
    assert report.is_file() and "<svg" in report.read_text()
    assert "Capacity report: GLM-4.6" in report.read_text()  # a section for the model the demo ran
    runs = Store(db, read_only=True).runs()
    assert len(runs) == len(configs) * len(loads) == len(first["runs"])
    assert set(runs.status) == {"completed"} and (runs.requests > 0).all()
    with Store(db, read_only=True).connect() as con:
        kinds = {k for (k,) in con.execute("SELECT DISTINCT error_kind FROM requests WHERE status <> 'ok'").fetchall()}
    assert kinds <= {"cancelled"}  # only requests still running when a run's time was up
    demo.run_demo(db, report, duration_s=3.0, configs=configs[:1], loads=loads[:1])
    assert len(Store(db, read_only=True).runs()) == len(runs) + 1  # the first demo's runs are kept


def test_demo_rejects_a_bad_duration():
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "demo", "--duration", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--duration must be > 0" in out.stderr and "Traceback" not in out.stderr
