"""One workload file, two readers: the simulator draws requests of the structure the load generator sends."""

import statistics

import pytest

from bench.errors import BadInput
from bench.model import workload
from loadgen import workloads as lg


def simulated(name: str, n: int = 800):
    return workload.make_requests(workload.load_workload(name), 1.0, n, seed=3, block=16, context=10**7)


@pytest.mark.parametrize("name", [n for n in lg.names() if lg.load(n).type not in ("trace",)])
def test_simulated_lengths_are_the_load_tests(name):
    """Mean prompt and answer tokens agree within sampling noise for every built-in workload (same distributions,
    same structure: shared prompts, sessions and turns, tool outputs)."""
    wl = lg.load(name)
    n = 800
    sent = [wl.request(i) for i in range(n)]
    sim = simulated(name, n)
    sent_in = statistics.fmean(s.input_tokens for s in sent)
    sent_out = statistics.fmean(s.body["max_tokens"] for s in sent)
    assert statistics.fmean(r.prompt_len for r in sim) == pytest.approx(sent_in, rel=0.12)
    assert statistics.fmean(r.max_new for r in sim) == pytest.approx(sent_out, rel=0.12)


def test_sessions_turn_as_the_load_generator_numbers_them():
    wl = lg.load("multi-turn")
    c, turns = wl.options["concurrent_sessions"], wl.options["turns"]
    reqs = simulated("multi-turn", c * turns)
    for s in range(c):
        chain = reqs[s::c]  # session s, turn by turn
        assert len(chain) == turns
        for a, b in zip(chain, chain[1:], strict=False):
            assert b.prompt_len > a.prompt_len + a.max_new - 1  # resends the prompt and an answer, adds input
            assert b.prompt_keys[:len(a.prompt_keys)] == a.prompt_keys
    # the next block of requests starts new conversations: no keys shared with the first block's sessions
    nxt = simulated("multi-turn", 2 * c * turns)[c * turns]
    assert not set(nxt.prompt_keys) & {k for r in reqs for k in r.prompt_keys}


def test_shared_prefix_shares_system_prompts_and_questions():
    reqs = simulated("shared-prefix", 16 * 32 * 2)
    wl = lg.load("shared-prefix")
    sys_blocks = wl.options["system_tokens"] // 16
    firsts = {tuple(r.prompt_keys[:sys_blocks]) for r in reqs}
    assert len(firsts) == wl.options["groups"]  # one system prompt per group
    whole = [tuple(r.prompt_keys) for r in reqs]
    assert len(set(whole)) < len(whole)  # questions are asked again: whole prompts repeat


def test_agentic_coding_shares_one_system_prompt_across_sessions():
    reqs = simulated("agentic-coding", 64)
    blocks = lg.load("agentic-coding").options["system_tokens"] // 16
    assert len({tuple(r.prompt_keys[:blocks]) for r in reqs}) == 1


def test_synthetic_lengths_from_the_command_line():
    wl = workload.fixed_workload("uniform:100-200", "50")
    reqs = workload.make_requests(wl, 1.0, 300, seed=0, block=16, context=10**6)
    assert min(r.prompt_len for r in reqs) >= 100 and max(r.prompt_len for r in reqs) <= 200
    assert {r.max_new for r in reqs} == {50}
    assert workload.fixed_workload(1000, 500).name == "synthetic-1000-500"


@pytest.mark.parametrize("bad", [("0", "10"), ("uniform:9-3", "10"), ("10", "gauss:3"), ("ten", "10")])
def test_bad_lengths_are_one_line(bad):
    with pytest.raises(BadInput, match="--input-len|--output-len"):
        workload.fixed_workload(*bad)


def test_the_old_simulate_schema_is_refused_with_what_to_write(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("name: old\ninput_len: {fixed: 10}\noutput_len: {fixed: 10}\n")
    with pytest.raises(BadInput, match="older schema.*input:/output:"):
        workload.load_workload(str(old))


def test_a_trace_is_not_simulated(tmp_path):
    tr = tmp_path / "t.yaml"
    tr.write_text("type: trace\n")
    with pytest.raises(BadInput, match="trace"):
        workload.load_workload(str(tr))
