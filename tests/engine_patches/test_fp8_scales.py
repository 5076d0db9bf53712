"""FP8 KV scales on SGLang's real pools (CPU): calibrate on BF16 writes, load, write FP8, compare with scale 1.0.

Prints the measured errors (run with -s to see them)."""

import json

import pytest
import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_loader.weight_utils import kv_cache_scales_loader
from sglang.srt.runtime_context import get_parallel

from engine_patches.fp8_scales import loading, recorder
from engine_patches.fp8_scales.scales_file import build_scales, merge_rank_dumps, read_kv_scales, write_scales

TOKENS, PAGE, HEADS, HEAD_DIM, LAYERS = 96, 16, 2, 64, 3
KV_LORA, ROPE = 64, 16
SPIKES = [300.0, 1500.0, 3000.0]  # layer 0 stays under 448; layers 1 and 2 have outliers past it


@pytest.fixture
def restore_pools(monkeypatch):
    """The patches replace class methods; put the originals back after each test."""
    for cls, names in ((MHATokenToKVPool, ["set_kv_buffer"]),
                       (MLATokenToKVPool, ["set_kv_buffer", "set_mla_kv_buffer", "get_mla_kv_buffer"])):
        for name in names:
            monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(loading, "MLA_SCALES", {})


def outlier_data(shape, layer: int, gen: torch.Generator, spike: float) -> torch.Tensor:
    """Activations of size ~ 4 * 2^layer with a dozen outliers of magnitude `spike`."""
    x = torch.randn(*shape, generator=gen) * (4.0 * 2**layer)
    idx = torch.randint(0, x.numel(), (12,), generator=gen)
    x.view(-1)[idx] = spike * torch.sign(torch.randn(12, generator=gen))
    return x.to(torch.bfloat16)


def rel_err(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    return float((x_hat.float() - x.float()).norm() / x.float().norm())


def radix_attention(layer_id: int) -> RadixAttention:
    return RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, HEADS, layer_id=layer_id)


class TinyDecoder(torch.nn.Module):
    """Only the attribute path the loaders walk (model.layers[i].self_attn.<attn>), holding SGLang's real
    RadixAttention modules; building a whole Glm4MoeForCausalLM/DeepseekV2ForCausalLM needs a running engine."""

    def __init__(self, layers: int, mla: bool):
        super().__init__()
        self.config = type("Config", (), {"num_hidden_layers": layers})()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        for i in range(layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            layer.self_attn.add_module("attn_mqa" if mla else "attn", radix_attention(i))
            self.model.layers.append(layer)
        self.w = torch.nn.Parameter(torch.zeros(1))


def test_mha_calibrated_scales_beat_scale_one_with_outliers(tmp_path, restore_pools):
    gen = torch.Generator().manual_seed(0)
    ks = [outlier_data((TOKENS, HEADS, HEAD_DIM), i, gen, SPIKES[i]) for i in range(LAYERS)]
    vs = [outlier_data((TOKENS, HEADS, HEAD_DIM), i, gen, SPIKES[i] / 2) for i in range(LAYERS)]
    loc = torch.arange(PAGE, PAGE + TOKENS)
    layers = [radix_attention(i) for i in range(LAYERS)]

    # calibration: SGLang's BF16 pool, the recorder hooked into its set_kv_buffer
    amax_path = tmp_path / "amax"
    recs = recorder.install(amax_path, interval_s=0.0)
    bf16 = MHATokenToKVPool(256, PAGE, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    for i in range(LAYERS):
        bf16.set_kv_buffer(layers[i], loc, ks[i].clone(), vs[i].clone())
    recs["mha"].dump()
    layout, amax = merge_rank_dumps(recorder.read_dumps(amax_path))
    assert layout == "mha"
    for i in range(LAYERS):
        assert amax[i] == (float(ks[i].abs().max()), float(vs[i].abs().max()))
    doc = build_scales(layout, amax, LAYERS, tp_size=2, model_type="glm4_moe")
    path = write_scales(doc, tmp_path / "kv.json")

    # SGLang's own loader reads the file (one joint scale per layer and rank) ...
    for rank in (0, 1):
        joint = dict(kv_cache_scales_loader(str(path), rank, 2, LAYERS, "glm4_moe"))
        assert joint == {i: max(amax[i]) / 448.0 for i in range(LAYERS)}
    # ... and ours gives the separate K and V scales, validated by SGLang's schema
    scales = read_kv_scales(path, 1, 2, LAYERS, "glm4_moe")
    assert scales == {i: (amax[i][0] / 448.0, amax[i][1] / 448.0) for i in range(LAYERS)}
    with pytest.raises(Exception, match="TP size"):
        read_kv_scales(path, 0, 4, LAYERS, "glm4_moe")

    # the loading patch puts them on the layers (one rank here: a file for TP 2 is refused above)
    path = write_scales(build_scales(layout, amax, LAYERS, tp_size=1, model_type="glm4_moe"), tmp_path / "kv1.json")
    model = TinyDecoder(LAYERS, mla=False)
    loading.glm4_moe_load_kv_cache_scales(model, str(path))
    for i in range(LAYERS):
        a = model.model.layers[i].self_attn.attn
        assert (a.k_scale_float, a.v_scale_float) == pytest.approx(scales[i], rel=1e-7)
        assert float(a.k_scale) == a.k_scale_float

    # FP8 pool: calibrated scales vs scale 1.0 (SGLang's default for GLM)
    fp8 = MHATokenToKVPool(256, PAGE, torch.float8_e4m3fn, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    report = {}
    for i in range(LAYERS):
        a = model.model.layers[i].self_attn.attn
        fp8.set_kv_buffer(a, loc, ks[i].clone(), vs[i].clone(), a.k_scale, a.v_scale)
        k_cal = fp8.get_key_buffer(i)[loc].float() * a.k_scale_float
        v_cal = fp8.get_value_buffer(i)[loc].float() * a.v_scale_float
        fp8.set_kv_buffer(a, loc, ks[i].clone(), vs[i].clone())
        k_one, v_one = fp8.get_key_buffer(i)[loc].float(), fp8.get_value_buffer(i)[loc].float()
        report[i] = {"k_cal": rel_err(k_cal, ks[i]), "k_one": rel_err(k_one, ks[i]),
                     "v_cal": rel_err(v_cal, vs[i]), "v_one": rel_err(v_one, vs[i])}
    print("\nMHA FP8 KV relative error (calibrated vs scale 1.0):", json.dumps(report, indent=1))
    for i in range(LAYERS):
        assert report[i]["k_cal"] < 0.05 and report[i]["v_cal"] < 0.05  # e4m3: 3 mantissa bits
    for i in (1, 2):  # outliers past 448 saturate at scale 1.0
        assert report[i]["k_one"] > 5 * report[i]["k_cal"]
        assert report[i]["v_one"] > 2 * report[i]["v_cal"]


def test_mla_scaled_fp8_writes_and_reads(tmp_path, restore_pools):
    gen = torch.Generator().manual_seed(1)
    nopes = [outlier_data((TOKENS, 1, KV_LORA), i, gen, SPIKES[i]) for i in range(LAYERS)]
    ropes = [outlier_data((TOKENS, 1, ROPE), i, gen, SPIKES[i] / 4) for i in range(LAYERS)]
    loc = torch.arange(PAGE, PAGE + TOKENS)
    layers = [radix_attention(i) for i in range(LAYERS)]
    amax_path = tmp_path / "amax"
    recs = recorder.install(amax_path, interval_s=0.0)
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):
        bf16 = MLATokenToKVPool(256, PAGE, torch.bfloat16, KV_LORA, ROPE, LAYERS, "cpu", False)
        for i in range(LAYERS):
            bf16.set_mla_kv_buffer(layers[i], loc, nopes[i], ropes[i])
        # the combined-row door records the latent and rope parts separately too
        bf16.set_kv_buffer(layers[0], loc, torch.cat([nopes[0], ropes[0]], -1), None)
        recs["mla"].dump()
        layout, amax = merge_rank_dumps(recorder.read_dumps(amax_path))
        assert layout == "mla"
        assert amax[2] == (float(nopes[2].abs().max()), float(ropes[2].abs().max()))
        path = write_scales(build_scales(layout, amax, LAYERS, tp_size=1, model_type="kimi_k2"), tmp_path / "k.json")
        assert dict(kv_cache_scales_loader(str(path), 0, 1, LAYERS, "kimi_k2")) == {
            i: max(amax[i]) / 448.0 for i in range(LAYERS)}

        loading.install_mla_pool_scaling()
        model = TinyDecoder(LAYERS, mla=True)
        loading.deepseek_v2_load_kv_cache_scales(model, str(path))
        fp8 = MLATokenToKVPool(256, PAGE, torch.float8_e4m3fn, KV_LORA, ROPE, LAYERS, "cpu", False)
        report = {}
        for i in range(LAYERS):
            s = loading.MLA_SCALES[i]
            assert model.model.layers[i].self_attn.attn_mqa.k_scale_float == pytest.approx(max(amax[i]) / 448.0)
            assert s == max(amax[i]) / 448.0
            fp8.set_mla_kv_buffer(layers[i], loc, nopes[i], ropes[i])  # patched: divides by s
            raw = fp8.get_key_buffer(i)[loc].float()
            nope_cal, rope_cal = fp8.get_mla_kv_buffer(layers[i], loc, torch.bfloat16)  # patched: multiplies
            assert torch.equal(nope_cal.float(), (raw[..., :KV_LORA] * s).to(torch.bfloat16).float())
            loading.MLA_SCALES.pop(i)  # scale 1.0: SGLang's plain cast
            fp8.set_mla_kv_buffer(layers[i], loc, nopes[i], ropes[i])
            nope_one, rope_one = fp8.get_mla_kv_buffer(layers[i], loc, torch.bfloat16)
            loading.MLA_SCALES[i] = s
            report[i] = {"latent_cal": rel_err(nope_cal, nopes[i]), "latent_one": rel_err(nope_one, nopes[i]),
                         "rope_cal": rel_err(rope_cal, ropes[i]), "rope_one": rel_err(rope_one, ropes[i])}
    print("\nMLA FP8 KV relative error (calibrated vs scale 1.0):", json.dumps(report, indent=1))
    for i in range(LAYERS):
        assert report[i]["latent_cal"] < 0.05
    for i in (1, 2):
        assert report[i]["latent_one"] > 5 * report[i]["latent_cal"]


def test_patched_sglang_signatures_are_the_ones_the_wrappers_expect():
    """SGLang moves fast: the wrappers pass these parameters by name and position (pinned to 0.5.23)."""
    import inspect

    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.glm4_moe import Glm4MoeForCausalLM

    def params(f):
        return list(inspect.signature(f).parameters)

    assert params(MHATokenToKVPool.set_kv_buffer)[:5] == ["self", "layer", "loc_info", "cache_k", "cache_v"]
    assert "layer_id_override" in params(MHATokenToKVPool.set_kv_buffer)
    assert params(MLATokenToKVPool.set_kv_buffer) == ["self", "layer", "loc_info", "cache_k", "cache_v",
                                                      "layer_id_override"]
    assert params(MLATokenToKVPool.set_mla_kv_buffer) == ["self", "layer", "loc_info", "cache_k_nope",
                                                          "cache_k_rope", "layer_id_override"]
    assert params(MLATokenToKVPool.get_mla_kv_buffer) == ["self", "layer", "loc", "dst_dtype"]
    for cls in (Glm4MoeForCausalLM, DeepseekV2ForCausalLM):  # the loaders we add must not shadow SGLang's own
        assert "load_kv_cache_scales" not in cls.__dict__ or cls.__dict__["load_kv_cache_scales"].__module__ == \
            "engine_patches.fp8_scales.loading"
