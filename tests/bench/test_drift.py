"""Quality drift against two real twins configured to agree or to diverge."""

import json
import math
import subprocess
import sys

import pytest

from bench import drift, drift_prompts
from bench.store import Store
from bench.twin import TwinConfig, serve_in_thread


def test_committed_prompt_set_is_what_the_seed_gives():
    lines = drift_prompts.DRIFT_PROMPTS.read_text().splitlines()
    assert [json.loads(line) for line in lines] == drift_prompts.build()
    kinds = {json.loads(line)["kind"] for line in lines}
    assert kinds == {"chat", "long-context", "code", "tool-call"}


def test_kl_is_zero_for_equal_and_positive_for_different_heads():
    p = {"a": math.log(0.6), "b": math.log(0.3), "c": math.log(0.1)}
    assert drift.kl_topk(p, dict(p)) == pytest.approx(0.0, abs=1e-12)
    q = {"a": math.log(0.3), "b": math.log(0.6), "d": math.log(0.1)}
    assert drift.kl_topk(p, q) > 0.1


def test_compare_counts_positions_and_first_divergence():
    prompt = {"id": "x", "kind": "chat"}
    top = [{"t": -0.1}] * 5
    a = drift.Answer(tokens=list("abcde"), top=top)
    b = drift.Answer(tokens=list("abXde"), top=top)
    d = drift.compare(prompt, a, b)
    assert d.token_agreement == pytest.approx(0.8) and d.first_divergence == 2 and not d.exact_match
    shorter = drift.compare(prompt, a, drift.Answer(tokens=list("abc"), top=top[:3]))
    assert shorter.first_divergence == 3 and shorter.token_agreement == pytest.approx(0.6)
    same = drift.compare(prompt, a, a)
    assert same.exact_match and same.first_divergence is None and same.mean_kl == pytest.approx(0.0)


@pytest.fixture(scope="module")
def twins():
    handles = [serve_in_thread(TwinConfig(model="glm-4.6", time_scale=200, drift=d)) for d in (0.0, 0.0, 0.2)]
    yield [(h.url, "zai-org/GLM-4.6") for h in handles]
    for h in handles:
        h.close()


def test_identical_twins_agree_everywhere(twins):
    prompts = drift.load_prompts(None)[::4]
    rows = drift.measure([twins[0], twins[1]], prompts)
    assert all(r.error is None for r in rows)
    assert all(r.exact_match and r.token_agreement == 1.0 and r.mean_kl == 0.0 for r in rows)


def test_drifting_twin_is_caught_per_kind(twins):
    prompts = drift.load_prompts(None)
    rows = drift.measure([twins[0], twins[2]], prompts)
    summary = {s["kind"]: s for s in drift.by_kind(rows)}
    assert summary["all"]["prompts"] == len(prompts) and summary["all"]["errors"] == 0
    # 20 % of greedy tokens differ: agreement near 80 %, and almost every answer diverges somewhere
    assert 0.7 < summary["all"]["token_agreement"] < 0.9
    assert summary["all"]["exact_match"] < 0.2
    assert summary["all"]["mean_kl"] > 0  # the drifting twin's distributions differ before the first divergence too
    assert set(summary) == {"chat", "long-context", "code", "tool-call", "all"}


def test_cli_stores_a_run_with_a_row_per_prompt(tmp_path, twins):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in drift.load_prompts(None)[:6]) + "\n")
    db = tmp_path / "c.duckdb"
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "drift",
                          "--target", twins[0][0], "--target", twins[2][0], "--prompts", str(prompts),
                          "--db", str(db), "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    store = Store(db, read_only=True)
    with store.connect() as con:
        n, agreement = con.execute("SELECT count(*), avg(token_agreement) FROM drift WHERE run_id = ?",
                                   [run_id]).fetchone()
    assert n == 6 and agreement < 1.0
    assert store.run(run_id)["status"] == "completed"


def test_cli_needs_two_targets_and_readable_prompts(tmp_path):
    cmd = [sys.executable, "-c", "from bench.cli import main; main()", "drift", "--db", str(tmp_path / "d.duckdb")]
    one = subprocess.run(cmd + ["--target", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert one.returncode == 2 and "exactly two" in one.stderr and "Traceback" not in one.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    out = subprocess.run(cmd + ["--target", "http://127.0.0.1:9", "--target", "http://127.0.0.1:9",
                                "--prompts", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bad.jsonl:1" in out.stderr


def test_family_comes_from_the_served_model_name():
    assert drift.family_of("moonshotai/Kimi-K2-Thinking") == "kimi"
    assert drift.family_of("zai-org/GLM-4.6") == "glm" and drift.family_of("my-model") == "other"


def test_gate_names_each_family_and_kind_that_misses_a_threshold():
    summary = [{"family": "glm", "kind": "code", "errors": 0, "mean_kl": 0.2, "token_agreement": 0.97,
                "exact_match": 0.5},
               {"family": "glm", "kind": "chat", "errors": 1, "mean_kl": 0.01, "token_agreement": 0.8,
                "exact_match": None}]
    failures = drift.Gate(max_mean_kl=0.05, min_token_agreement=0.9).failures(summary)
    assert failures == ["glm/code: mean_kl 0.2 > 0.05", "glm/chat: 1 prompts failed",
                        "glm/chat: token_agreement 0.8 < 0.9"]
    assert drift.Gate().failures(summary[:1]) == [] and not drift.Gate().active


def test_cli_gate_exits_1_on_a_drifting_server_and_0_on_an_identical_one(tmp_path, twins):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in drift.load_prompts(None)[::5]) + "\n")
    cmd = [sys.executable, "-c", "from bench.cli import main; main()", "drift", "--prompts", str(prompts),
           "--db", str(tmp_path / "g.duckdb"), "--json", "--max-mean-kl", "0.02", "--min-token-agreement", "0.95"]
    bad = subprocess.run(cmd + ["--target", twins[0][0], "--target", twins[2][0]], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1, bad.stderr
    out = json.loads(bad.stdout)
    assert out["family"] == "glm" and out["gate"]["passed"] is False
    assert any(f.startswith("glm/all: token_agreement") for f in out["gate"]["failures"])
    assert {s["kind"] for s in out["by_kind"]} == {"chat", "long-context", "code", "tool-call", "all"}
    good = subprocess.run(cmd + ["--target", twins[0][0], "--target", twins[1][0]], capture_output=True, text=True,
                          timeout=120)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["gate"] == {"thresholds": {"max_mean_kl": 0.02, "min_token_agreement": 0.95,
                                                              "min_exact_match": None}, "passed": True,
                                               "failures": []}


def test_two_unreachable_servers_are_a_failed_run_not_a_drift_of_zero(tmp_path):
    db = tmp_path / "u.duckdb"
    proc = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "drift", "--target",
                           "http://127.0.0.1:9", "--target", "http://127.0.0.1:11", "--model", "m", "--db", str(db)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "prompts failed" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert list(Store(db, read_only=True).runs().status) == ["failed"]
