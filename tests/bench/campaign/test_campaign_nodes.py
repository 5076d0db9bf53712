"""A campaign deployment's `gpu_metrics`: each of its runs scrapes the named endpoints (a fake DCGM exporter here)
into its GPU samples, per node and GPU; another deployment's runs do not."""

import subprocess
import sys
from pathlib import Path

import duckdb

from tests.bench.store.dcgm_exporter import FakeDcgm

ROOT = Path(__file__).resolve().parents[3]


def test_each_run_of_a_deployment_scrapes_its_gpu_nodes(tmp_path):
    exporter = FakeDcgm(hostname="gpu7")
    f = tmp_path / "c.yaml"
    f.write_text("name: t\nslo: \"ttft=10s,tpot=200ms\"\nduration: 2\ndeployments:\n"
                 f"  - {{name: watched, twin: \"glm-4.6@h200x8,time_scale=10\", gpu_metrics: [\"{exporter.url}\"]}}\n"
                 "  - {name: plain, twin: \"glm-4.6@h200x8,time_scale=10\"}\n"
                 "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n")
    db = tmp_path / "c.duckdb"
    try:
        out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "campaign", str(f), "--db",
                              str(db)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        exporter.close()
    assert out.returncode == 0, out.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT config->>'$.cell', g.node, g.gpu, count(*) FROM gpu_samples g JOIN runs USING "
                           "(run_id) GROUP BY ALL ORDER BY ALL").fetchall()
    assert [(c, n, g) for c, n, g, _ in rows] == [("watched/a", "gpu7", 0), ("watched/a", "gpu7", 1)]
    assert all(k >= 1 for *_, k in rows)  # each run scraped the exporter at least once
