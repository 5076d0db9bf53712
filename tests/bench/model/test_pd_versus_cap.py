"""`capbench plan --pd --max-concurrency N`: both sides are sized behind the cap. The disaggregated side caps each
decode instance's batch and counts the wait for a slot (M/M/c, bench/model/serving/queues.py) in the TTFT it judges,
as the
colocated search's simulated client does."""

import math

import pytest

from bench.model import Plan, Question, parse_slo, queues
from bench.model.pd import disagg
from bench.model.pd import versus as pd_versus

SLO = parse_slo("ttft=2s,tpot=50ms,p=90")


def _versus(cap: int | None) -> pd_versus.Versus:
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat", slo=SLO,
                 target_rate_rps=10.0, max_concurrency=cap)
    return pd_versus.compare(Plan(q, [], 0), max_nodes=2)  # the PD side alone: no colocated search


def test_a_capped_plan_sizes_its_disaggregated_side_behind_the_cap():
    free, loose, tight = _versus(None), _versus(100_000), _versus(16)
    d, t = free.disaggregated, tight.disaggregated
    assert d is not None and loose.disaggregated.decode_rps == pytest.approx(d.decode_rps)  # a cap far above: no change
    assert t is not None and t.decode_rps < d.decode_rps and t.gpus_needed > d.gpus_needed
    assert "concurrency cap (16 in flight" in t.decode_limited_by
    dp = t.shape.deployment("decode").dp
    assert t.batch_per_rank <= math.ceil(16 / dp)
    assert t.decode_rps < 16 / (t.lengths.output * t.tpot_s)  # Little's law: 16 held for output x TPOT each
    assert t.ttft_s <= SLO.ttft_s + 1e-9  # the slot's wait is inside the bound it was judged by
    said = [w for w in tight.why if "concurrency cap" in w]
    assert len(said) == 1 and "(16 in flight" in said[0]
    assert not any("concurrency cap" in w for w in free.why)


def test_the_wait_for_a_slot_is_erlang_c():
    one = queues.slot_wait_quantile(0.5, 1, 1.0, 0.9)  # one slot is M/M/1, the prefill queue's own formula
    assert one == pytest.approx(queues.mm1_wait_quantile(1.0, 0.5, 0.9)) == pytest.approx(math.log(5) / 0.5)
    assert queues.slot_wait_quantile(10.0, 64, 1.0, 0.9) == 0.0  # far below the slots: no wait at p90
    assert queues.slot_wait_quantile(64.0, 64, 1.0, 0.9) == math.inf
    r = queues.capped_rate(64, 1.0, 0.5, 2.0, 0.9)
    assert 0.5 + queues.slot_wait_quantile(r, 64, 1.0, 0.9) == pytest.approx(2.0, abs=1e-3) and r < 64


def test_one_slot_per_rank_below_the_ranks_still_serves():
    shape = disagg.Shape("glm-4.6", "h200", 8, 8, "fp8_e4m3")
    ln = disagg.lengths(Question(model="glm-4.6", gpu="h200", workload="chat", slo=SLO).request_mix())
    a = disagg.evaluate(shape, ln, SLO, 5.0, in_flight=2)
    assert a.serves and a.batch_per_rank == 1 and a.decode_rps < 2 / (ln.output * a.tpot_s)
