"""The plan's caches: the answers shipped for the README's first question are today's full search's, found without
a single simulation, and so are the demo report's curves; a change to any input of an answer misses them; workers
add answers side by side without losing any; a rewritten calibration file is read again."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace

import pytest

from bench import demo
from bench.benchmarks.plan_cache import QUESTIONS, readme_question
from bench.model import calibration, curve, make_plan, rate, simulate
from bench.model.serving.workload import load_workload


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty cache of your own, nothing in memory: answers come from the shipped file or are computed."""
    monkeypatch.setenv("CAPBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("CAPBENCH_SHIPPED_CACHE", raising=False)
    monkeypatch.setattr(rate, "_memory", {})
    return tmp_path


def _counting(monkeypatch) -> list[int]:
    calls = [0]
    real = simulate.run

    def run(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulate, "run", run)
    return calls


@pytest.mark.slow
def test_the_shipped_answers_are_the_full_searchs_figures(empty_cache, monkeypatch):
    q = readme_question()
    calls = _counting(monkeypatch)
    shipped = make_plan(q, workers=1)
    assert calls[0] == 0  # every screen and every finalist's rate came from data/plan-cache/rates.json

    monkeypatch.setenv("CAPBENCH_SHIPPED_CACHE", "0")
    monkeypatch.setattr(rate, "_memory", {})
    (empty_cache / "rates.json").unlink(missing_ok=True)
    full = make_plan(q, workers=2)  # today's search, every answer computed
    assert json.loads((empty_cache / "rates.json").read_text())  # ... and it did compute them
    assert shipped.rows() == full.rows()
    assert shipped.recommended.to_row() == full.recommended.to_row() and len(full.simulated) >= 8
    assert shipped.notes == full.notes


def test_the_shipped_file_covers_each_built_in_question(empty_cache, monkeypatch):
    shipped = json.loads(rate.SHIPPED_CACHE.read_text())
    q = QUESTIONS["planner"][0]
    dep, wl = q.deployment(), q.request_mix()
    key = rate._key(dep, wl, q.slo, rate.load_efficiency(dep.gpu.id))
    assert key in shipped, "data/plan-cache/rates.json is stale: run `make plan-cache`"
    calls = _counting(monkeypatch)
    assert rate.search_rate(dep, wl, q.slo).rate_rps == shipped[key]["rate_rps"]
    assert calls[0] == 0


@pytest.mark.parametrize("model", demo.MODELS)
def test_the_demo_reports_plan_and_curves_come_from_the_shipped_file(empty_cache, monkeypatch, model):
    q = demo.report_question(model)
    calls = _counting(monkeypatch)
    plan = make_plan(q, workers=1)
    shipped = plan.curves()
    assert calls[0] == 0, "data/plan-cache/rates.json is stale: run `make plan-cache`"
    assert len(shipped["points"]) >= 10
    # one configuration's curve simulated afresh gives the shipped points
    monkeypatch.setenv("CAPBENCH_SHIPPED_CACHE", "0")
    monkeypatch.setattr(rate, "_memory", {})
    o = next(o for o in plan.simulated if o.serves)
    fresh = curve.curve(o.label, o.config.deployment(q.model, q.context), q.request_mix())
    assert calls[0] > 0 and fresh
    by_level = {(p["config"], p["concurrency"]): p for p in shipped["points"]}
    for p in fresh:
        assert by_level[(p.config, p.concurrency)]["tps_per_gpu"] == p.tps_per_gpu


def test_a_change_to_any_input_of_an_answer_is_a_change_of_key():
    q = readme_question()
    dep, wl, eff = q.deployment(), q.request_mix(), rate.load_efficiency("h200")
    key = rate._key(dep, wl, q.slo, eff)
    assert rate._key(replace(dep, context=dep.model.max_context), wl, q.slo, eff) == key  # the same question
    faster = dep.gpu.model_copy(update={"hbm_tbps": dep.gpu.hbm_tbps * 1.1})
    deeper = dep.model.model_copy(update={"layers": dep.model.layers + 1})
    changed = [replace(dep, gpu=faster), replace(dep, model=deeper), replace(dep, kv_dtype="fp8_e4m3")]
    keys = {rate._key(d, wl, q.slo, eff) for d in changed}
    keys |= {rate._key(dep, load_workload("agentic-coding"), q.slo, eff),
             rate._key(dep, wl, replace(q.slo, ttft_s=1.0), eff),
             rate._key(dep, wl, q.slo, replace(eff, hbm_eff=eff.hbm_eff * 0.9))}
    assert key not in keys and len(keys) == 6


def test_the_simulators_source_is_in_the_key(monkeypatch):
    q = readme_question()
    dep, wl, eff = q.deployment(), q.request_mix(), rate.load_efficiency("h200")
    key = rate._key(dep, wl, q.slo, eff)
    monkeypatch.setattr(rate, "_code", lambda: "another scheduler")
    assert rate._key(dep, wl, q.slo, eff) != key


TRACED = """
import builtins, json, sys
import pyarrow.parquet as pq
from dataclasses import replace
from bench.benchmarks.plan_cache import readme_question
from bench.model import rate
ran, opened = set(), set()
real_open, real_read = builtins.open, pq.read_table
builtins.open = lambda f, *a, **k: (opened.add(str(f)), real_open(f, *a, **k))[1]
pq.read_table = lambda f, *a, **k: (opened.add(str(f)), real_read(f, *a, **k))[1]
q = readme_question()
deps, wl = [replace(q.deployment(), kv_dtype=kv) for kv in ("bf16", "fp8_e4m3")], q.request_mix()
def trace(frame, event, arg):
    ran.add(frame.f_code.co_filename)
sys.settrace(trace)
for dep in deps:  # what the key holds (the deployment, the workload) is built before the trace
    rate.saturation_tps(dep, wl, 64)
sys.settrace(None)
builtins.open = real_open
print(json.dumps({"ran": sorted(ran), "opened": sorted(opened),
                  "hashed": [str(f) for f in rate.simulator_files()]}))
"""


def test_every_file_a_search_executes_or_reads_is_in_the_key(tmp_path):
    """A fresh process, an empty cache, the screen of two deployments traced from its first line: each Python file
    of the project it runs and each data file it opens (the kernel tables through pyarrow too) is one the key
    hashes, or is in the key already (the model's and GPU's data, the workload, the factors). So no edit of what
    sizes, schedules or prices a step leaves a stale answer standing; before, eight modules were hashed and
    kernel_step.py, the kernel tables and the prefix cache were not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "CAPBENCH_CACHE": str(tmp_path), "CAPBENCH_SHIPPED_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", TRACED], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    root = str(Path(rate.__file__).resolve().parents[3])
    hashed = set(got["hashed"])
    ours = {f for f in got["ran"] + got["opened"] if f.startswith(root) and "/.venv/" not in f}
    simulator = {f for f in got["ran"] if "/bench/model/step/" in f or "/bench/model/serving/" in f}
    assert any(f.endswith("kernel_step.py") for f in simulator) and any(f.endswith(".parquet") for f in ours)
    # the model's and GPU's data, the workload and the factors are in the key as values; bench/files.py reads and
    # checks any file (the data it hands on is hashed)
    keyed_elsewhere = ("/data/models/", "/data/gpus.yaml", "/data/workloads/", "/data/calibration/corpus.json",
                       "/data/calibration/fitted.json", "/data/plan-cache/", "/bench/files.py")
    missing = sorted(f for f in ours if f not in hashed and not any(k in f for k in keyed_elsewhere))
    assert not missing, f"run or read by a search but not in the answers' key: {missing}"


def _store_many(args: tuple[str, int]) -> None:
    cache, worker = args
    import os

    os.environ["CAPBENCH_CACHE"] = cache
    for i in range(40):
        rate._store(f"w{worker}-{i}", float(i))


def test_workers_storing_side_by_side_lose_no_answer(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_store_many, [(str(tmp_path), w) for w in range(4)])
    stored = json.loads((tmp_path / "rates.json").read_text())
    assert len(stored) == 160 and stored["w3-39"] == 39.0


def test_a_rewritten_calibration_file_is_read_again(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"hbm_eff": 0.5}))
    assert calibration.load_efficiency("h200", f).hbm_eff == 0.5
    f.write_text(json.dumps({"hbm_eff": 0.7}))
    assert calibration.load_efficiency("h200", f).hbm_eff == 0.7
    f.write_text("[1, 2]")
    with pytest.raises(calibration.BadInput, match="holds a map"):
        calibration.load_efficiency("h200", f)


def test_the_shipped_file_holds_every_replay_validate_makes(empty_cache, monkeypatch):
    """`capbench validate` on a fresh clone replays nothing (1.9 s, not 7.5 s): every published case's replay is
    shipped, and a shipped one is the fresh replay's figures."""
    from bench.model import corpus, load_efficiency, validate

    cases = [c for c in corpus.load() if c.kind != "disaggregated"]
    real = validate.replay
    monkeypatch.setattr(validate, "replay", lambda *a, **k: pytest.fail("replayed: run `make plan-cache`"))
    shipped = [validate.remembered(c, load_efficiency(c.gpu, fitted=False)) for c in cases]
    monkeypatch.setattr(validate, "replay", real)
    for i in (0, len(cases) // 2, len(cases) - 1):
        fresh = real(cases[i], load_efficiency(cases[i].gpu, fitted=False))
        assert (shipped[i].predicted, shipped[i].errors) == (fresh.predicted, fresh.errors)
