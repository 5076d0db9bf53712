"""`capbench plan --pd --max-concurrency N`: the colocated side is sized behind the cap, the disaggregated side by
the analytic PD model, which takes no cap; the comparison says so instead of setting the two side by side as
answers to the same load."""

from bench.model import Plan, Question, parse_slo, pd_versus


def _versus(cap: int | None) -> pd_versus.Versus:
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat",
                 slo=parse_slo("ttft=2s,tpot=50ms,p=90"), target_rate_rps=10.0, max_concurrency=cap)
    return pd_versus.compare(Plan(q, [], 0), max_nodes=2)  # the PD side alone: no colocated search


def test_a_capped_plan_says_its_disaggregated_figures_are_uncapped():
    capped, free = _versus(64), _versus(None)
    assert capped.disaggregated is not None and capped.disaggregated == free.disaggregated
    said = [w for w in capped.why if "concurrency cap" in w]
    assert len(said) == 1 and "(64 in flight)" in said[0]
    assert not any("concurrency cap" in w for w in free.why)
