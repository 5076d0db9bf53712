"""Seeded workloads: reproducible, the asked-for lengths, shared prefixes, growing sessions, tool-call shapes."""

import json
import random
import statistics

import pytest

from loadgen import workloads
from loadgen.workloads import Lengths, WorkloadError


def words(spec) -> int:
    body = spec.body
    text = body.get("prompt") or " ".join(str(m.get("content") or "") for m in body["messages"])
    return len(text.split())


def test_same_seed_same_requests_other_seed_other_requests():
    a = workloads.from_dict({"name": "w", "input": {"dist": "uniform", "min": 10, "max": 500}}, seed=1)
    b = workloads.from_dict({"name": "w", "input": {"dist": "uniform", "min": 10, "max": 500}}, seed=1)
    c = workloads.from_dict({"name": "w", "input": {"dist": "uniform", "min": 10, "max": 500}}, seed=2)
    assert [a.request(i) for i in range(50)] == [b.request(i) for i in range(50)]
    assert [a.request(i) for i in range(50)] != [c.request(i) for i in range(50)]
    assert a.request(7) == workloads.from_dict(a.to_dict()).request(7)  # what workers rebuild from the config


@pytest.mark.parametrize("spec,lo,hi,mean", [
    ({"dist": "fixed", "value": 300}, 300, 300, 300),
    ({"dist": "uniform", "min": 100, "max": 200}, 100, 200, 150),
    ({"dist": "normal", "mean": 500, "std": 50, "min": 1}, 300, 700, 500),
    ({"dist": "lognormal", "median": 400, "sigma": 0.5, "min": 50, "max": 4000}, 50, 4000, 400 * 1.133),
    ({"dist": "histogram", "bins": [[10, 20, 3], [1000, 1000, 1]]}, 10, 1000, (15 * 3 + 1000) / 4),
])
def test_length_distributions(spec, lo, hi, mean):
    dist, rng = Lengths.parse(spec), random.Random(0)
    xs = [dist.sample(rng) for _ in range(4000)]
    assert lo <= min(xs) and max(xs) <= hi
    assert statistics.mean(xs) == pytest.approx(mean, rel=0.05)


def test_prompt_lengths_match_the_draws_up_to_long_context():
    w = workloads.from_dict({"name": "lc", "type": "long_context", "input": {"dist": "uniform", "min": 8192,
                                                                            "max": 262144}, "output": 64})
    for i in range(3):
        spec = w.request(i)
        assert 8192 <= spec.input_tokens <= 262144 and words(spec) == spec.input_tokens
        assert spec.body["max_tokens"] == 64 and spec.body["ignore_eos"] is True


def test_shared_prefix_groups():
    w = workloads.from_dict({"name": "sp", "type": "shared_prefix", "groups": 4, "system_tokens": 300, "input": 20})
    reqs = [w.request(i) for i in range(12)]
    systems = [r.body["messages"][0]["content"] for r in reqs]
    assert len(set(systems)) == 4 and systems[0] == systems[4] == systems[8]
    assert len(systems[0].split()) == 300
    assert len({r.body["messages"][1]["content"] for r in reqs}) == 12  # every question differs


def test_multi_turn_sessions_resend_growing_context():
    w = workloads.from_dict({"name": "mt", "type": "multi_turn", "turns": 3, "concurrent_sessions": 2,
                             "input": 30, "output": 10})
    # requests 0..5: session 0 and 1 interleaved, turns 0,1,2
    s0 = [w.request(i).body["messages"] for i in (0, 2, 4)]
    assert [len(m) for m in s0] == [1, 3, 5]
    assert s0[1][:1] == s0[0] and s0[2][:3] == s0[1]
    assert [m["role"] for m in s0[2]] == ["user", "assistant", "user", "assistant", "user"]
    assert w.request(1).body["messages"][0] != s0[0][0]  # another session


def test_agentic_coding_turns_are_tool_call_shaped():
    w = workloads.from_dict({"name": "ac", "type": "agentic_coding", "turns": 4, "concurrent_sessions": 1,
                             "system_tokens": 500, "input": 50, "output": 100,
                             "tool_output": {"dist": "fixed", "value": 200}})
    turns = [w.request(i) for i in range(4)]
    assert turns[3].body["messages"][: len(turns[2].body["messages"])] == turns[2].body["messages"]
    msgs = turns[3].body["messages"]
    assert msgs[0]["role"] == "system" and turns[3].body["tools"]
    calls = [m for m in msgs if m["role"] == "assistant"]
    results = [m for m in msgs if m["role"] == "tool"]
    assert len(calls) == len(results) == 3
    for call, result in zip(calls, results, strict=True):
        tc = call["tool_calls"][0]
        assert tc["type"] == "function" and result["tool_call_id"] == tc["id"]
        json.loads(tc["function"]["arguments"])
    assert turns[3].input_tokens > turns[1].input_tokens > turns[0].input_tokens
    with pytest.raises(WorkloadError):
        workloads.from_dict({"name": "x", "type": "agentic_coding", "api": "completions"})


def test_sharegpt_file(tmp_path):
    data = [{"id": "a", "conversations": [{"from": "human", "value": "hello there " * 10},
                                          {"from": "gpt", "value": "x" * 400}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "no human first"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    w = workloads.load(str(path), seed=3)
    spec = w.request(0)
    assert spec.body["messages"][0]["content"].startswith("hello there")
    assert spec.body["max_tokens"] == 100
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(WorkloadError):
        workloads.load(str(tmp_path / "bad.json")).request(0)


def test_trace_rows_with_shared_hash_ids_share_prefix_text():
    w = workloads.from_dict({"name": "trace", "type": "trace", "block_tokens": 16})
    a = w.request(0, {"input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]})
    b = w.request(1, {"input_length": 40, "output_length": 7, "hash_ids": [1, 2, 9]})
    ta, tb = a.body["messages"][0]["content"].split(), b.body["messages"][0]["content"].split()
    assert len(ta) == len(tb) == 40 and ta[:32] == tb[:32] and ta[32:] != tb[32:]
    assert (a.body["max_tokens"], b.body["max_tokens"]) == (5, 7)


def test_built_in_workloads_one_schema():
    for name in workloads.names():
        spec = workloads.load(name).request(0)
        assert spec.body["max_tokens"] >= 1 and spec.input_tokens >= 1
    agentic, chat = workloads.load("agentic-coding"), workloads.load("chat")
    assert agentic.type == "agentic_coding" and agentic.options["system_tokens"] == 6000
    assert agentic.options["concurrent_sessions"] == 32
    assert chat.type == "shared_prefix" and chat.options["groups"] == 8
    sp = workloads.load("shared-prefix")  # 16 system prompts x 32 questions, then again
    n = 16 * 32
    assert sp.request(5) == sp.request(5 + n) and sp.request(5) != sp.request(5 + 16)
    with pytest.raises(WorkloadError, match="older schema"):  # the simulator's old keys say what to write instead
        workloads.from_dict({"name": "sim", "input_len": {"fixed": 300}, "output_len": {"fixed": 256}})


def test_sharegpt_sends_every_conversation_once_per_epoch():
    w = workloads.load("sharegpt")
    n = len(w.sharegpt_pairs())
    prompts = [(w.request(i).body["messages"][0]["content"], w.request(i).body["max_tokens"]) for i in range(2 * n)]
    assert len(set(prompts[:n])) == len(set(w.sharegpt_pairs())) == n  # the file's pairs are all different
    assert set(prompts[:n]) == set(prompts[n:]) and prompts[:n] != prompts[n:]


def test_bad_workloads_say_what_is_wrong(tmp_path):
    with pytest.raises(WorkloadError, match="unknown workload"):
        workloads.load("no-such-workload")
    with pytest.raises(WorkloadError, match="dist"):
        workloads.from_dict({"name": "x", "input": {"dist": "zipf"}})
    (tmp_path / "w.yaml").write_text("input: [unclosed")
    with pytest.raises(WorkloadError, match="YAML"):
        workloads.load(str(tmp_path / "w.yaml"))
