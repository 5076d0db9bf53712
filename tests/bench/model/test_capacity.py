"""Capacity figures against values worked out by hand from the published configs."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.errors import BadInput
from bench.model import capacity as cap
from bench.model import catalog

KIMI = catalog.model("kimi-k2-thinking")
GLM = catalog.model("glm-4.6")
H200 = catalog.gpu("h200")

# Kimi K2 (MLA): (kv_lora_rank 512 + rope 64) * 61 layers * elem, whole on every TP rank.
# GLM-4.6 (GQA): kv_heads_per_gpu * (128 + 128) * 92 layers * elem, kv_heads_per_gpu = max(1, 8 // tp).
CELLS = [
    (KIMI, "bf16", 1, 576 * 61 * 2), (KIMI, "bf16", 8, 70272), (KIMI, "bf16", 16, 70272),
    (KIMI, "fp8_e4m3", 1, 35136), (KIMI, "fp8_e4m3", 8, 35136), (KIMI, "fp8_e4m3", 16, 35136),
    (GLM, "bf16", 1, 8 * 256 * 92 * 2), (GLM, "bf16", 8, 47104), (GLM, "bf16", 16, 47104),
    (GLM, "fp8_e4m3", 1, 188416), (GLM, "fp8_e4m3", 8, 23552), (GLM, "fp8_e4m3", 16, 23552),
    (GLM, "fp8_e5m2", 8, 23552),
]


@pytest.mark.parametrize("model,kv,tp,expected", CELLS, ids=lambda v: getattr(v, "id", str(v)))
def test_cell_bytes_by_hand(model, kv, tp, expected):
    assert cap.cell_bytes(model, kv, tp) == expected


def test_mtp_draft_layer_adds_its_share():
    # GLM's one MTP layer: cell + int(cell * 1 / 92)
    assert cap.cell_bytes(GLM, "bf16", 8, mtp=True) == 47104 + int(47104 / 92)


# reserved MiB = 512 + chunked_prefill * 1.5 + tp/8 * 1024 + decode graph max_bs * 2 + prefill graph
# H200 (143771 MiB): chunked_prefill 8192; max_bs 256 (tp < 4) or 512.
# MLA prefill graph reserve: 1536 MiB. MHA: 58 prefill capture sizes up to 8192 * 8 MiB = 464 MiB.
FRACTIONS = [
    (KIMI, 1, round((143771 - (512 + 12288 + 128 + 512 + 1536)) / 143771, 3)),
    (KIMI, 8, round((143771 - (512 + 12288 + 1024 + 1024 + 1536)) / 143771, 3)),
    (KIMI, 16, round((143771 - (512 + 12288 + 2048 + 1024 + 1536)) / 143771, 3)),
    (GLM, 1, round((143771 - (512 + 12288 + 128 + 512 + 464)) / 143771, 3)),
    (GLM, 8, round((143771 - (512 + 12288 + 1024 + 1024 + 464)) / 143771, 3)),
    (GLM, 16, round((143771 - (512 + 12288 + 2048 + 1024 + 464)) / 143771, 3)),
]


@pytest.mark.parametrize("model,tp,expected", FRACTIONS, ids=lambda v: getattr(v, "id", str(v)))
def test_mem_fraction_static_by_hand(model, tp, expected):
    assert cap.mem_fraction_static(model, H200, tp) == expected


def test_h100_floor_of_10_gib_applies():
    h100 = catalog.gpu("h100-sxm")  # 81559 MiB: reserved 15312 MiB for GLM at tp 8, above the 10 GiB floor
    assert cap.mem_fraction_static(GLM, h100, 8) == round((81559 - 15312) / 81559, 3)


def test_kimi_thinking_int4_weights_by_hand():
    h, inter, experts = 7168, 2048, 384
    routed = 60 * experts * 3 * h * inter * (0.5 + 2 / 32) / 8
    shared = 60 * 1 * 3 * h * inter / 8 * 2
    mla_split = 1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * h
    mla_replicated = h * 1536 + h * 576
    attention = 61 * (mla_replicated + mla_split / 8) * 2
    dense = 1 * 3 * h * 18432 / 8 * 2
    embeddings = 2 * 163840 * h / 8 * 2
    wb = cap.weight_bytes(KIMI, "int4-g32", tp=8)
    assert wb.routed_experts == pytest.approx(routed)
    assert wb.shared_experts == pytest.approx(shared)
    assert wb.attention == pytest.approx(attention)
    assert wb.dense_mlp == pytest.approx(dense)
    assert wb.embeddings == pytest.approx(embeddings)
    assert 74e9 < wb.total < 78e9  # the public INT4 checkpoint is ~594 GB over 8 GPUs


def test_published_totals_within_3_percent():
    for model in catalog.models().values():
        assert cap.total_params(model) / 1e9 == pytest.approx(model.published_params_b["total"], rel=0.03)


@pytest.mark.parametrize("model,tp", [(KIMI, 8), (KIMI, 16), (GLM, 8), (GLM, 16), (GLM, 32)])
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_pool_tokens_by_hand(model, tp, kv):
    dep = cap.Deployment(model, H200, tp, kv_dtype=kv, weights="native", page_size=64)
    got = cap.capacity(dep)
    free = 143771 * 2**20 - H200.reserved_before_load_gib * 2**30
    frac = cap.mem_fraction_static(model, H200, tp)
    budget = free * frac - cap.weight_bytes(model, "native", tp).total
    expected = int(budget // cap.cell_bytes(model, kv, tp)) // 64 * 64
    assert got.kv_pool_tokens == expected
    assert got.max_running_requests == min(max(min(int(expected / model.max_context * 512), 4096), 2048),
                                           expected // 2)
    assert got.max_concurrent_sequences_at_context == min(got.max_running_requests, expected // model.max_context)
    assert got.fits


def test_glm_tp1_does_not_fit_and_says_by_how_much():
    got = cap.capacity(cap.Deployment(GLM, H200, 1))
    assert not got.fits
    assert got.kv_pool_tokens == 0
    assert got.short_by_bytes_per_gpu > 500e9  # 355B bf16 params on one 141 GB card


def test_dp_attention_multiplies_mla_pools():
    one = cap.capacity(cap.Deployment(KIMI, H200, 8, dp=1))
    eight = cap.capacity(cap.Deployment(KIMI, H200, 8, dp=8))
    assert eight.kv_pool_tokens_total == eight.kv_pool_tokens * 8
    # the latent is no longer duplicated per rank; the larger DP graph reserve and replicated attention eat some
    assert eight.kv_pool_tokens_total > 3 * one.kv_pool_tokens


def test_compare_has_four_rows_with_gains():
    rows = cap.compare(cap.Deployment(GLM, H200, 8))
    assert [(r.weights, r.kv_dtype) for r in rows] == [
        ("native", "bf16"), ("native", "fp8_e4m3"), ("int4-g32", "bf16"), ("int4-g32", "fp8_e4m3")]
    assert rows[1].ratios["kv_pool_tokens"] == pytest.approx(2.0, rel=1e-4)
    assert rows[3].kv_pool_tokens > rows[1].kv_pool_tokens  # INT4 experts free memory for KV
    assert rows[2].ratios["weight_bytes_per_gpu"] < 0.4


@pytest.mark.parametrize("kwargs,message", [
    (dict(tp=6), "power of two"),
    (dict(tp=8, dp=3), "--dp must divide"),
    (dict(tp=8, context=10**7), "beyond glm-4.6's maximum"),
    (dict(tp=8, kv_dtype="int8"), "unknown --kv-dtype"),
    (dict(tp=8, weights="int3"), "unknown weights"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(BadInput, match=message):
        cap.Deployment(GLM, H200, **kwargs)


def test_unknown_ids_list_the_valid_ones():
    with pytest.raises(BadInput, match="valid: .*glm-4.6"):
        catalog.model("glm-9")
    with pytest.raises(BadInput, match="valid: .*h200"):
        catalog.gpu("h300")


models = st.sampled_from(sorted(catalog.models()))
tps = st.sampled_from([4, 8, 16, 32])
pages = st.sampled_from([1, 16, 32, 64])


@settings(max_examples=60, deadline=None)
@given(models, tps, pages, st.sampled_from(["native", "int4-g32", "fp8"]))
def test_fp8_doubles_pool_within_page_rounding(model_id, tp, page, weights):
    model = catalog.model(model_id)
    bf16 = cap.capacity(cap.Deployment(model, H200, tp, weights=weights, page_size=page), with_ratios=False)
    fp8 = cap.capacity(cap.Deployment(model, H200, tp, kv_dtype="fp8_e4m3", weights=weights, page_size=page),
                       with_ratios=False)
    if bf16.kv_budget_bytes_per_gpu > 0:
        assert abs(fp8.kv_pool_tokens - 2 * bf16.kv_pool_tokens) <= 2 * page


@settings(max_examples=60, deadline=None)
@given(models, tps, pages, st.integers(40_000, 200_000), st.integers(1, 60_000))
def test_more_memory_never_fewer_tokens_and_page_multiple(model_id, tp, page, mem_mib, extra_mib):
    model = catalog.model(model_id)
    small = H200.model_copy(update={"memory_mib_reported": mem_mib})
    big = H200.model_copy(update={"memory_mib_reported": mem_mib + extra_mib})
    # a fixed fraction isolates "more memory" from SGLang's tiered reserve, which can step the fraction down
    a = cap.capacity(cap.Deployment(model, small, tp, page_size=page, mem_fraction=0.88), with_ratios=False)
    b = cap.capacity(cap.Deployment(model, big, tp, page_size=page, mem_fraction=0.88), with_ratios=False)
    assert b.kv_pool_tokens >= a.kv_pool_tokens
    assert a.kv_pool_tokens % page == 0 and b.kv_pool_tokens % page == 0
    assert math.isfinite(a.kv_budget_bytes_per_gpu)
