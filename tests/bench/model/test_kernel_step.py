"""A step priced from the kernel tables: the table's latency at a grid point, monotonic in batch and context, the
roofline where no table covers an operator (and said), the case's own SGLang version and backend in validate."""

import pytest

from bench.model import catalog, corpus, kernels
from bench.model.evidence.validate import deployment
from bench.model.fits.capacity import Deployment
from bench.model.step.calibration import load_efficiency
from bench.model.step.perfmodel import PerfModel


def dep(model="kimi-k2-thinking", gpu="h200", tp=8, **kw) -> Deployment:
    return Deployment(catalog.model(model), catalog.gpu(gpu), tp, **kw)


def test_a_decode_step_holds_the_tables_attention_at_a_grid_point():
    d = dep(attention="fa3", kv_dtype="fp8_e4m3", sglang="0.5.14")
    pm = PerfModel(d, load_efficiency("h200"))
    parts = pm.kstep.step(32, 32 * 32768, 1, 32, 32, 32, 0, 0.0, True)
    layer, _ = kernels.attention_time(d.model, "h200", "fa3", "fp8_e4m3", "decode", 32, 32768, 8, "0.5.14")
    assert parts["attention"] == pytest.approx(d.model.layers * layer)
    assert layer * 1e3 == pytest.approx(2.04, abs=0.01)  # the published fa3 FP8 MLA figure, per layer


def test_step_time_grows_with_batch_and_context():
    pm = PerfModel(dep(), load_efficiency("h200"))
    by_batch = [pm.step_time(b, b * 4096) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    by_ctx = [pm.step_time(16, 16 * c) for c in (1024, 2048, 4096, 8192, 16384, 32768)]
    assert by_batch == sorted(by_batch) and by_ctx == sorted(by_ctx)
    assert pm.model_said.startswith("kernel tables")


def test_fp8_kv_on_fa3_costs_kimi_step_time_on_h200():
    """fa3 upcasts the whole FP8 MLA layer each step: the tables time it 5-7x BF16's attention."""
    bf16 = PerfModel(dep(attention="fa3"), load_efficiency("h200"))
    fp8 = PerfModel(dep(attention="fa3", kv_dtype="fp8_e4m3"), load_efficiency("h200"))
    assert fp8.step_time(64, 64 * 16384) > 1.3 * bf16.step_time(64, 64 * 16384)


def test_an_unmeasured_operator_is_priced_by_the_roofline_and_said():
    pm = PerfModel(dep(kv_dtype="fp8_e4m3", attention="flashmla"), load_efficiency("h200"))
    assert pm.step_time(8, 8 * 4096) > 0
    assert pm.unmeasured["attention decode"] == ("no kernel measurement for flashmla MLA decode with fp8_e4m3 KV "
                                                 "on h200: roofline")
    assert "roofline" in pm.model_said
    amd = PerfModel(dep(gpu="mi300x"), load_efficiency("mi300x"))
    assert amd.kstep is None and amd.model_said == "no kernel measurement for mi300x: roofline"
    assert amd.step_time(8, 8 * 4096) > 0


def test_the_roofline_switch_prices_every_gpu_by_the_roofline(monkeypatch):
    monkeypatch.setenv("CAPBENCH_PERF", "roofline")
    pm = PerfModel(dep(), load_efficiency("h200"))
    assert pm.kstep is None and "roofline" in pm.model_said


def test_validate_replays_a_case_on_its_own_version_and_default_backend():
    cases = [c for c in corpus.load() if c.kind == "throughput" and c.tp and c.gpu == "b200"
             and c.sglang_version.startswith("0.5.") and c.model.startswith("deepseek")]
    c = cases[0]
    d = deployment(c)
    assert d.sglang == c.sglang_version
    assert d.attention == (c.attention_backend or "trtllm_mla")
    pm = PerfModel(d, load_efficiency("b200"))
    pm.step_time(4, 4 * 2048)
    v = kernels.pick(kernels.versions("b200", "attention"), c.sglang_version)[0]
    assert f"SGLang {v} " in pm.kstep.sources["attention decode"]


@pytest.mark.parametrize("d", [
    dep("kimi-k2-thinking", "b200", 4, ep=4, kv_dtype="fp8_e4m3"),
    dep("glm-4.6", "h200", 8),
    dep("kimi-k2-thinking", "h200", 8, dp=8, ep=8),  # DP attention: the busiest group's share
    dep("glm-4.6", "h100-sxm", 8, weights="int4-g128", kv_dtype="fp8_e4m3"),
    dep("glm-4.6", "mi300x", 8),  # no tables: every step through parts()
], ids=lambda d: f"{d.model.id}-{d.gpu.id}-tp{d.tp}-dp{d.dp}-{d.weights}-{d.kv_dtype}")
def test_a_decode_step_priced_once_per_batch_size_is_the_same_float_as_through_parts(d):
    """step_time's decode shortcut (_decode_on_tables) against the full arithmetic: bit for bit, batches in and
    beyond the CUDA-graph sizes, one request to hundreds, contexts of one token to a million."""
    import random

    fast, full = PerfModel(d, load_efficiency(d.gpu.id)), PerfModel(d, load_efficiency(d.gpu.id))
    full.fast_decode = False
    rng = random.Random(7)
    cases = [(1, 1), (1, 7), (3, 3 * 131072)] + [(n, n * rng.randint(1, 40000)) for n in
                                                  [rng.randint(1, 600) for _ in range(300)]]
    for n, ctx in cases:
        assert fast.step_time(n, ctx) == full.step_time(n, ctx), (n, ctx)
    assert full._decode_terms == {}
    assert bool(fast._decode_terms) == (fast.kstep is not None)  # the shortcut ran where the tables price decode
