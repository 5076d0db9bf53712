"""The performance model's roofline terms, by hand, and the properties a planner relies on. The roofline prices
what no kernel table covers; here it prices every GPU (CAPBENCH_PERF=roofline), so its arithmetic is checked on the
GPUs whose figures are by hand. The kernel-table step is tests/bench/model/test_kernel_step.py's."""

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.errors import BadInput
from bench.model import catalog
from bench.model.fits.capacity import Deployment, bytes_per_weight, cell_bytes, weight_bytes
from bench.model.step.calibration import Efficiency, load_efficiency
from bench.model.step.perfmodel import PerfModel, cost_per_million_tokens, expected_experts, prefill_pairs, summary


@pytest.fixture(autouse=True)
def roofline(monkeypatch):
    monkeypatch.setenv("CAPBENCH_PERF", "roofline")


def kimi(**kw) -> Deployment:
    return Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, **kw)


def priors() -> Efficiency:
    return load_efficiency("h200", fitted=False)


def test_expected_experts_grows_from_top_k_to_all():
    assert expected_experts(384, 8, 1) == pytest.approx(8)
    assert expected_experts(384, 8, 0) == 0
    values = [expected_experts(384, 8, b) for b in (1, 4, 16, 64, 256, 4096)]
    assert values == sorted(values) and values[-1] == pytest.approx(384, rel=1e-6)
    assert expected_experts(384, 8, 2) == pytest.approx(8 + 8 * (1 - 8 / 384))


def test_memory_term_by_hand_at_batch_one():
    """One decode step at batch 1, context 0: 8 of 384 experts' bytes + every other weight but the input
    embedding, over 4.8 TB/s * hbm_eff."""
    dep, eff = kimi(), priors()
    wb = weight_bytes(dep.model, "native", 8)
    expected = (wb.routed_experts * 8 / 384 + wb.total - wb.routed_experts - wb.embeddings / 2) / (4.8e12 * eff.hbm_eff)
    assert PerfModel(dep, eff).parts(1, 0)["memory"] == pytest.approx(expected)


def test_fixed_kernel_costs_come_from_the_counted_kernels():
    eff = priors()
    pm = PerfModel(kimi(), eff)
    assert pm.parts(1, 0)["fixed"] == pytest.approx(61 * 22 * eff.kernel_us * 1e-6)
    glm = PerfModel(Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8), eff)
    assert glm.parts(1, 0)["fixed"] == pytest.approx(92 * 18 * eff.kernel_us * 1e-6)


def test_memory_and_compute_overlap_partly():
    eff = priors()
    pm = PerfModel(kimi(), eff)
    p = pm.parts(64, 64 * 2000)
    core = max(p["memory"], p["compute"]) + (1 - eff.overlap) * min(p["memory"], p["compute"])
    step = max(core + p["fixed"] + p["comm"], p["launch"]) + p["overhead"]
    assert pm.step_time(64, 64 * 2000) == pytest.approx(max(step, 64 * eff.stream_token_us * 1e-6))


def test_fp8_kv_halves_kv_bytes_and_speeds_up_long_context_decode():
    bf16, fp8 = PerfModel(kimi(), priors()), PerfModel(kimi(kv_dtype="fp8_e4m3"), priors())
    batch, ctx = 64, 64 * 32768
    kv_bf16 = bf16.parts(batch, ctx)["memory"] - bf16.parts(batch, 0)["memory"]
    kv_fp8 = fp8.parts(batch, ctx)["memory"] - fp8.parts(batch, 0)["memory"]
    assert kv_fp8 == pytest.approx(kv_bf16 / 2)
    assert kv_bf16 == pytest.approx(cell_bytes(kimi().model, "bf16", 8) * ctx / (4.8e12 * priors().hbm_eff))
    assert fp8.step_time(batch, ctx) < bf16.step_time(batch, ctx)
    # with FP8 experts the KV is most of a long-context step; INT4 experts' unpacking leaves it a smaller share
    fp8_fp8 = PerfModel(kimi(weights="fp8", kv_dtype="fp8_e4m3"), priors())
    assert fp8_fp8.step_time(batch, ctx) < 0.8 * PerfModel(kimi(weights="fp8"), priors()).step_time(batch, ctx)


def test_int4_moe_unpacking_takes_the_measured_time_at_16_tokens():
    """vLLM issue 32832 (data/calibration/default.yaml, int4_moe_unpack): 234 us a layer for the two W4A16 MoE
    kernels of Kimi K2 on H200 TP8 at concurrency 16, where the bytes alone would take about 70 us."""
    pm = PerfModel(kimi(weights="native"), priors())
    moe_layers = pm.dep.model.moe_layers
    bytes_read, seconds = pm._moe(16)
    assert seconds / moe_layers == pytest.approx(234e-6, rel=0.05)
    assert bytes_read / moe_layers / (4.8e12 * priors().hbm_eff) < seconds / moe_layers / 2


def test_int4_moe_unpacking_grows_once_an_expert_has_more_tokens_than_a_tile():
    pm = PerfModel(kimi(weights="native"), priors())
    tile = priors().int4_moe_m_tile
    tokens_for = lambda rows: rows * pm.experts / pm.top_k  # noqa: E731 (every expert hit at these loads)
    _, one_tile = pm._moe(tokens_for(tile))
    _, two_tiles = pm._moe(tokens_for(2 * tile))
    assert two_tiles == pytest.approx(2 * one_tile, rel=0.02)
    fp8 = PerfModel(kimi(weights="fp8"), priors())
    assert pm._moe(16)[1] > fp8._moe(16)[1]  # unpacking costs more than FP8's compute at decode batches


def test_int4_experts_read_fewer_bytes_and_cost_more_compute_as_the_gemm_fills():
    int4, fp8 = PerfModel(kimi(weights="native"), priors()), PerfModel(kimi(weights="fp8"), priors())
    assert int4.expert_bytes / fp8.expert_bytes == pytest.approx(bytes_per_weight("int4-g32") /
                                                                 bytes_per_weight("fp8-block128"))
    cheap = PerfModel(kimi(weights="native"), Efficiency(**{**priors().to_dict(), "int4_dequant": 1.0}))
    small = int4.parts(1, 0)["compute"] / cheap.parts(1, 0)["compute"]
    large = int4.parts(4096, 0)["compute"] / cheap.parts(4096, 0)["compute"]
    assert 1 <= small < large <= priors().int4_dequant  # the W4A16 penalty grows with the batch


def test_expert_parallelism_costs_the_slowest_rank_and_widens_the_gemms():
    tp, ep = PerfModel(kimi(), priors()), PerfModel(kimi(ep=8), priors())
    assert ep.expert_width == 8 * tp.expert_width
    # at batch 1 the 8 ranks hit different numbers of experts: the busiest reads more than the average
    assert ep.parts(1, 0)["memory"] > tp.parts(1, 0)["memory"]
    # at large batch the wider GEMMs win
    assert ep.parts(2048, 0)["compute"] < tp.parts(2048, 0)["compute"]


def test_dp_attention_gathers_around_the_moe():
    eff = priors()
    dp = PerfModel(kimi(dp=8), eff)
    assert dp.parts(1, 0)["comm"] >= 61 * 2 * eff.dp_gather_latency_us * 1e-6


def test_mtp_keeps_accept_length_tokens_per_step():
    eff = priors()
    spec = PerfModel(Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8, mtp=True, mtp_steps=3), eff)
    p = eff.mtp_accept
    assert spec.accept_length == pytest.approx(1 + p + p ** 2 + p ** 3)
    plain = PerfModel(Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8), eff)
    # at small batch a step verifies 4 tokens for about the price of one: faster per token
    assert spec.step_time(4, 4 * 1000) / spec.accept_length < plain.step_time(4, 4 * 1000)


def test_streaming_paces_many_streams():
    eff = priors()
    pm = PerfModel(kimi(), eff)
    floor = 2000 * eff.stream_token_us * 1e-6
    assert pm.step_time(2000, 2000 * 300) >= floor * (1 - 1e-12)  # the floor itself, up to float rounding


def test_prefill_pays_cpu_launches_and_attention_is_superlinear():
    pm = PerfModel(kimi(), priors())
    assert pm.parts(0, 0, 100, prefill_pairs(100, 0), 100)["launch"] > 0
    assert pm.parts(8, 8000)["launch"] == 0  # a decode batch under the CUDA-graph size replays a graph
    assert pm.prefill_time(131072) > 4 * pm.prefill_time(32768)
    assert prefill_pairs(4, 10) == 4 * 10 + 10


def test_cost_per_million_tokens_by_hand():
    assert cost_per_million_tokens(kimi(), 1000) == pytest.approx(3.79 * 8 / 3600 / 1000 * 1e6)
    assert cost_per_million_tokens(kimi(), 0) == math.inf
    assert summary(kimi(kv_dtype="fp8_e4m3"), 4096)["max_batch_at_context"] > summary(kimi(), 4096)[
        "max_batch_at_context"]


GPUS = st.sampled_from(["h100-sxm", "h200", "b200", "a100-80gb"])
MODELS = st.sampled_from(["kimi-k2-thinking", "glm-4.6", "deepseek-v3", "glm-4.5-air"])


@settings(max_examples=60, deadline=None)
@given(MODELS, GPUS, st.integers(1, 512), st.integers(0, 32768), st.integers(0, 16384), st.floats(1.1, 3.0))
def test_more_bandwidth_or_compute_never_predicts_less_throughput(model, gpu, batch, ctx, prefill, more):
    g = catalog.gpu(gpu)
    dep = Deployment(catalog.model(model), g, 8)
    faster_bw = Deployment(dep.model, g.model_copy(update={"hbm_tbps": g.hbm_tbps * more}), 8)
    faster_fl = Deployment(dep.model, g.model_copy(update={"bf16_tflops": g.bf16_tflops * more,
                                                           "fp8_tflops": g.fp8_tflops * more}), 8)
    eff = load_efficiency(gpu)
    args = (batch, batch * ctx, prefill, prefill_pairs(prefill, 0), prefill)
    base = PerfModel(dep, eff).step_time(*args)
    assert PerfModel(faster_bw, eff).step_time(*args) <= base * (1 + 1e-9)
    assert PerfModel(faster_fl, eff).step_time(*args) <= base * (1 + 1e-9)


def test_h100_slower_than_h200_slower_than_b200():
    for model in ("kimi-k2-thinking", "glm-4.6", "deepseek-v3"):
        times = [PerfModel(Deployment(catalog.model(model), catalog.gpu(g), 8), load_efficiency(g)).step_time(
            64, 64 * 4000) for g in ("h100-sxm", "h200", "b200")]
        assert times[0] > times[1] > times[2], (model, times)


def test_calibration_file_overrides_and_round_trips(tmp_path):
    path = tmp_path / "fit.json"
    Efficiency(hbm_eff=0.95, kernel_us=1.0).save(path)
    eff = load_efficiency("h200", path)
    assert eff.hbm_eff == 0.95 and eff.kernel_us == 1.0
    assert PerfModel(kimi(), eff).step_time(1, 0) < PerfModel(kimi(), priors()).step_time(1, 0)
    nested = tmp_path / "fit.yaml"
    nested.write_text("default: {bf16_eff: 0.3}\ngpus: {h200: {bf16_eff: {value: 0.4, source: fit}}}\n")
    assert load_efficiency("h200", nested).bf16_eff == 0.4
    assert load_efficiency("h100-sxm", nested).bf16_eff == 0.3


def test_every_prior_has_a_source():
    import yaml

    from bench.model.step.calibration import DEFAULT_CALIBRATION

    raw = yaml.safe_load(DEFAULT_CALIBRATION.read_text())
    for section in [raw["default"], raw["kernels"], *raw["gpus"].values()]:
        for name, value in section.items():
            assert isinstance(value, dict) and value.get("source"), name
    assert set(raw["default"]) == set(Efficiency().to_dict())


@pytest.mark.parametrize("text, message", [
    (json.dumps({"hbm": 0.5}), "hbm: unknown key .known: .*hbm_eff"),
    (json.dumps({"hbm_eff": "fast"}), "hbm_eff: .*number.*'fast'"),
    (json.dumps({"hbm_eff": 0}), "hbm_eff: .*greater than 0, got 0"),  # divided by
    (json.dumps({"gpus": {"h200": {"hbm_eff": 1e308}}}), "gpus.h200.hbm_eff: .*less than or equal to 1"),
    ('{"kernel_us": NaN}', "NaN is not a finite number"),
    ('{"kernel_us": -Infinity}', "-Infinity is not a finite number"),
    ("[1, 2]", "map of factors"),
    ("{not json", "not a calibration JSON"),
])
def test_bad_calibration_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        load_efficiency("h200", path)
    with pytest.raises(BadInput, match="no such calibration file"):
        load_efficiency("h200", tmp_path / "missing.json")


def test_dp_attention_prefills_a_long_prompt_on_one_group():
    """Each request lives on one DP-attention group: a lone 8k chunk costs its group's full attention while the
    MoE still spreads over all GPUs; eight 1k chunks (one a group) cost what the even split says."""
    dp8 = PerfModel(kimi(dp=8, ep=8), priors())
    lone = dp8.step_time(0, 0, 8192, prefill_pairs(8192, 0), 8192, busiest=(8192, prefill_pairs(8192, 0)))
    even = dp8.step_time(0, 0, 8192, prefill_pairs(8192, 0), 8192)
    assert lone > 1.5 * even
    spread = 8 * prefill_pairs(1024, 0)
    assert dp8.step_time(0, 0, 8192, spread, 8192, busiest=(1024, prefill_pairs(1024, 0))) == pytest.approx(
        dp8.step_time(0, 0, 8192, spread, 8192))
    tp8 = PerfModel(kimi(), priors())  # without DP attention the busiest chunk changes nothing
    assert tp8.step_time(0, 0, 8192, prefill_pairs(8192, 0), 8192, busiest=(8192, prefill_pairs(8192, 0))) == (
        tp8.step_time(0, 0, 8192, prefill_pairs(8192, 0), 8192))


def test_roofline_scale_scales_the_gpu_time_of_a_gpu_without_tables_and_nothing_else(monkeypatch):
    """MI300X (no kernel table) at roofline_scale 2: memory, compute, the kernels' fixed cost and the all-reduces
    double; the CPU's launches and overhead do not. H200 on its tables ignores the factor."""
    dep = Deployment(catalog.model("deepseek-v3"), catalog.gpu("mi300x"), 8)
    eff = replace(load_efficiency("mi300x", fitted=False), roofline_scale=1.0)  # the corpus fit's is not 1
    args = dict(prefill_tokens=512, prefill_attn=512 * 256, prefill_ctx=512)
    one = PerfModel(dep, eff).parts(8, 8 * 2000, **args)
    two = PerfModel(dep, replace(eff, roofline_scale=2.0)).parts(8, 8 * 2000, **args)
    for term in ("memory", "compute", "fixed", "comm"):
        assert two[term] == pytest.approx(2 * one[term]) and one[term] > 0, term
    assert (two["launch"], two["overhead"]) == (one["launch"], one["overhead"]) and one["launch"] > 0
    monkeypatch.delenv("CAPBENCH_PERF")
    h200 = Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8)
    base = load_efficiency("h200", fitted=False)
    assert PerfModel(h200, replace(base, roofline_scale=3.0)).step_time(32, 32 * 4000) == \
        PerfModel(h200, base).step_time(32, 32 * 4000)
