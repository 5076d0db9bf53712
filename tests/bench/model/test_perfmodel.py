import json
import math

import pytest

from bench.errors import BadInput
from bench.model import catalog
from bench.model.capacity import Deployment, bytes_per_weight, cell_bytes, weight_bytes
from bench.model.perfmodel import (
    Efficiency,
    PerfModel,
    cost_per_million_tokens,
    expected_experts,
    load_efficiency,
    prefill_pairs,
    summary,
)


def kimi(**kw) -> Deployment:
    return Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, **kw)


def test_expected_experts_grows_from_top_k_to_all():
    assert expected_experts(384, 8, 1) == pytest.approx(8)
    assert expected_experts(384, 8, 0) == 0
    values = [expected_experts(384, 8, b) for b in (1, 4, 16, 64, 256, 4096)]
    assert values == sorted(values) and values[-1] == pytest.approx(384, rel=1e-6)
    # by hand: 2 tokens hit 8 + 8 * (1 - 8/384) distinct experts on average
    assert expected_experts(384, 8, 2) == pytest.approx(8 + 8 * (1 - 8 / 384))


def test_memory_term_by_hand_at_batch_one():
    """Bytes of one decode step at batch 1, context 0: 8 of 384 experts' bytes + every other weight but the
    input embedding, over 4.8 TB/s * hbm_eff."""
    dep, eff = kimi(), Efficiency()
    wb = weight_bytes(dep.model, "native", 8)
    expected = (wb.routed_experts * 8 / 384 + wb.total - wb.routed_experts - wb.embeddings / 2) / (4.8e12 * eff.hbm_eff)
    assert PerfModel(dep, eff).parts(1, 0)["memory"] == pytest.approx(expected)


def test_fp8_kv_halves_kv_bytes_and_speeds_up_long_context_decode():
    bf16, fp8 = PerfModel(kimi()), PerfModel(kimi(kv_dtype="fp8_e4m3"))
    batch, ctx = 64, 64 * 32768
    kv_bf16 = bf16.parts(batch, ctx)["memory"] - bf16.parts(batch, 0)["memory"]
    kv_fp8 = fp8.parts(batch, ctx)["memory"] - fp8.parts(batch, 0)["memory"]
    assert kv_fp8 == pytest.approx(kv_bf16 / 2)
    assert kv_bf16 == pytest.approx(cell_bytes(kimi().model, "bf16", 8) * ctx / (4.8e12 * Efficiency().hbm_eff))
    assert fp8.step_time(batch, ctx) < 0.8 * bf16.step_time(batch, ctx)
    # at batch 1 and a short context the floor dominates: no difference
    assert fp8.step_time(1, 100) == pytest.approx(bf16.step_time(1, 100))


def test_int4_experts_read_fewer_bytes_but_cost_dequant_compute():
    int4, fp8 = PerfModel(kimi(weights="native")), PerfModel(kimi(weights="fp8"))
    big = 512
    assert int4.parts(big, 0)["memory"] < fp8.parts(big, 0)["memory"]
    expert_ratio = int4.expert_bytes / fp8.expert_bytes
    assert expert_ratio == pytest.approx(bytes_per_weight("int4-g32") / bytes_per_weight("fp8-block128"))
    eff = Efficiency()
    no_dequant = PerfModel(kimi(weights="native"), Efficiency(int4_dequant_factor=1.0))
    assert int4.parts(big, 0)["compute"] > no_dequant.parts(big, 0)["compute"]
    assert eff.int4_dequant_factor > 1


def test_decode_step_time_grows_with_batch_and_context():
    pm = PerfModel(kimi())
    assert pm.step_time(64, 64 * 4096) < pm.step_time(256, 256 * 4096)
    assert pm.step_time(64, 64 * 1024) < pm.step_time(64, 64 * 16384)
    assert pm.decode_step_time([4096] * 10) == pytest.approx(pm.step_time(10, 40960))
    assert pm.decode_throughput(256, 4096) > pm.decode_throughput(1, 4096) * 50


def test_prefill_is_compute_bound_and_attention_superlinear():
    pm = PerfModel(kimi())
    p = pm.parts(0, 0, 16384, prefill_pairs(16384, 0), 16384)
    assert p["compute"] > p["memory"]
    t32k, t128k = pm.prefill_time(32768), pm.prefill_time(131072)
    assert t128k > 4 * t32k  # quadratic attention
    assert prefill_pairs(4, 10) == 4 * 10 + 10
    # chunked: same work, each chunk pays the floor, overhead and all-reduce latency again
    assert pm.prefill_time(65536, chunk=8192) > pm.prefill_time(65536)


def test_allreduce_only_with_tensor_parallelism():
    tp1 = PerfModel(Deployment(catalog.model("glm-4.5-air"), catalog.gpu("h200"), 1))
    assert tp1.allreduce_s(128) == 0
    pm = PerfModel(kimi())
    eff = Efficiency()
    msg = 128 * 7168 * 2
    one = 2 * 7 / 8 * msg / (450e9 * eff.allreduce_eff) + eff.allreduce_latency_us * 1e-6
    assert pm.allreduce_s(128) == pytest.approx(2 * 61 * one)


def test_cost_per_million_tokens_by_hand():
    # $3.79/GPU-hour * 8 GPUs / 1000 tok/s
    assert cost_per_million_tokens(kimi(), 1000) == pytest.approx(3.79 * 8 / 3600 / 1000 * 1e6)
    assert cost_per_million_tokens(kimi(), 0) == math.inf
    s = summary(kimi(kv_dtype="fp8_e4m3"), 4096)
    assert s["max_batch_at_context"] > summary(kimi(), 4096)["max_batch_at_context"]


def test_efficiency_defaults_come_from_the_data_file():
    shipped = load_efficiency("h200")
    assert shipped == Efficiency()  # the dataclass defaults mirror data/calibration/default.yaml
    assert load_efficiency("mi300x").hbm_eff == pytest.approx(0.6)


def test_calibration_file_overrides_and_round_trips(tmp_path):
    path = tmp_path / "fit.json"
    Efficiency(hbm_eff=0.9, layer_floor_us=100).save(path)
    eff = load_efficiency("h200", path)
    assert eff.hbm_eff == 0.9 and eff.layer_floor_us == 100
    assert PerfModel(kimi(), eff).step_time(1, 0) < PerfModel(kimi()).step_time(1, 0)
    nested = tmp_path / "fit.yaml"
    nested.write_text("default: {bf16_eff: 0.3}\ngpus: {h200: {bf16_eff: {value: 0.4, source: fit}}}\n")
    assert load_efficiency("h200", nested).bf16_eff == 0.4
    assert load_efficiency("h100-sxm", nested).bf16_eff == 0.3


@pytest.mark.parametrize("text, message", [
    (json.dumps({"hbm": 0.5}), "unknown factor 'hbm'"),
    (json.dumps({"hbm_eff": "fast"}), "non-negative number"),
    ("[1, 2]", "map of factors"),
    ("{not json", "not valid json"),
])
def test_bad_calibration_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        load_efficiency("h200", path)
    with pytest.raises(BadInput, match="not readable"):
        load_efficiency("h200", tmp_path / "missing.json")


def test_step_time_is_the_roofline_of_its_parts():
    import random

    rng = random.Random(0)
    for dep in (kimi(), kimi(kv_dtype="fp8_e4m3", weights="fp8"),
                Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8, dp=2)):
        pm = PerfModel(dep)
        for _ in range(200):
            d, p = rng.choice([0, 1, 7, 300]), rng.choice([0, 5, 8192])
            args = (d, d * rng.randint(1, 9000), p, prefill_pairs(p, rng.randint(0, 50000)), p + rng.randint(0, 9))
            parts = pm.parts(*args)
            expected = (max(parts["memory"], parts["compute"], parts["floor"]) + parts["allreduce"]
                        + parts["overhead"]) if d + p else 0.0
            assert pm.step_time(*args) == pytest.approx(expected, rel=1e-12)
