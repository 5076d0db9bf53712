"""A sweep's stages send the same requests at their own rates (common requests): `capbench campaign` as a subprocess
against a twin, whose prefix cache each stage empties first; the stored requests show the same prompts in the
same order at every rate, and none of them found in the cache by the stage after."""

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from bench.campaign.stage import flush_cache

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from bench.cli import main; main()", "campaign"]


def test_every_stage_of_a_sweep_resends_the_same_prompts_into_an_emptied_cache(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: common\nduration: 1.5\ndeployments:\n"
                 "  - {name: glm, twin: \"glm-4.6@h200x8,kv=bf16,mem_fraction=0.68,time_scale=15\"}\n"
                 "loads:\n  - {name: agents, workload: campaign-agentic, slo: \"ttft=10s,tpot=500ms\", "
                 "sweep: {start: 1.0, factor: 1.5, max_stages: 2, refine: 0, min_gain: 0}}\n")
    db = tmp_path / "c.duckdb"
    out = subprocess.run([*CLI, str(f), "--db", str(db)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT run_id, config FROM runs ORDER BY started_at").fetchall()
        stages = []
        for run_id, config in runs:
            rows = con.execute("SELECT prompt_tokens, coalesce(cached_tokens, 0) FROM requests WHERE run_id = ? AND "
                               "phase = 'measured' ORDER BY scheduled_at", [run_id]).fetchall()
            stages.append((json.loads(config), rows))
        [cell] = [json.loads(r) for (r,) in con.execute("SELECT result FROM campaign_cells").fetchall()]
    kept = [run_id for run_id, _ in runs if run_id in {p["run_id"] for p in cell["points"]}]  # not a re-run's other
    stages = [s for (run_id, _), s in zip(runs, stages, strict=True) if run_id in kept]
    assert cell["stage_s"] == 1.5 * 15  # the window each figure is of, in the modelled GPUs' seconds
    assert len(stages) >= 2
    rates = [c["profile"]["params"]["rate"] for c, _ in stages]
    assert len(set(rates)) == len(rates) and {c["seed"] for c, _ in stages} == {0}
    assert all(c["profile"]["params"]["nested"] for c, _ in stages)
    fewest = min(len(rows) for _, rows in stages)
    assert fewest >= 20
    first = [p for p, _ in stages[0][1][:fewest]]
    for _, rows in stages[1:]:
        assert [p for p, _ in rows[:fewest]] == first  # the same prompts, in the same order, at every rate
        # each request found in the cache what it found at the first stage's rate: only what its own stage (its
        # warm-up, its session's earlier turns) left there, never itself from the stage before
        assert rows[0][1] == stages[0][1][0][1] < rows[0][0]
    assert any(c > 0 for _, rows in stages for _, c in rows)  # the twin reports its cache hits


def test_a_server_without_a_flush_says_so():
    assert flush_cache("http://127.0.0.1:9") is False
