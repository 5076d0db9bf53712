"""INT4 expert conversion on tiny GLM-shaped (BF16) and Kimi-shaped (FP8 block-128) checkpoints:
compressed-tensors' decompressor, SGLang's scheme selection, and SGLang's fused INT4 MoE Triton kernel."""

import json

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp
from safetensors import safe_open

from engine_patches.int4_moe import pack
from engine_patches.int4_moe.convert import EXPERT_WEIGHT, REPORT
from tests.engine_patches.int4_checkpoints import EXPERTS, HIDDEN, cached_checkpoint, make_checkpoint

TP = {"glm": 8, "kimi-fp8": 2}  # g128 needs 128 expert rows per rank: tp 2 of the tiny 256


def quant_args(group_size: int) -> QuantizationArgs:
    return QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size,
                            dynamic=False, observer="minmax")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(kind, group) -> (source weights, output dir, report): converted once per test run (the GLM one is also the
    one test_int4_sglang_load.py loads)."""
    out = {}
    for kind, group in (("glm", 32), ("kimi-fp8", 128)):
        root = tmp_path_factory.mktemp(f"{kind}-{group}")
        weights = make_checkpoint(root / "in", kind)  # the same seeded weights the cached one was made from
        done = cached_checkpoint(kind, (f"int4-g{group}",), tp=TP[kind])
        out[kind] = (weights, done, json.loads((done / REPORT).read_text()), group)
    return out


def load_all(out_dir):
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(out_dir / shard, "pt") as f:
            for name in f.keys():
                assert index["weight_map"][name] == shard
                tensors[name] = f.get_tensor(name)
    assert set(tensors) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    return tensors


def decompress(tensors, module, group):
    scheme = QuantizationScheme(targets=["Linear"], weights=quant_args(group))
    sd = {k: tensors[f"{module}.{k}"] for k in ("weight_packed", "weight_scale", "weight_shape")}
    return PackedQuantizationCompressor.decompress(sd, scheme)["weight"].float()


@pytest.mark.parametrize("kind", ["glm", "kimi-fp8"])
def test_experts_round_trip_within_int4_error_rest_untouched(converted, kind):
    weights, out_dir, report, group = converted[kind]
    tensors = load_all(out_dir)
    errors = {}
    for name, w in weights.items():
        m = EXPERT_WEIGHT.match(name)
        if not m:  # attention, shared experts, dense MLP, router, embeddings, lm_head: as they were (FP8 -> bf16)
            shipped = torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16
            assert name in tensors and tensors[name].dtype == shipped
            assert torch.equal(tensors[name].float(), w.to(shipped).float()), name
            continue
        assert name not in tensors and tensors[m["module"] + ".weight_packed"].dtype == torch.int32
        w_hat = decompress(tensors, m["module"], group)
        scale = tensors[m["module"] + ".weight_scale"].float().repeat_interleave(group, 1)
        # symmetric INT4: every weight within half a step of its group's grid, plus the bf16 rounding of the
        # decompressed value (compressed-tensors returns the scale's dtype)
        assert ((w_hat - w).abs() <= scale / 2 + w.abs() * 2**-8 + 1e-7).all(), name
        errors[name] = float((w_hat - w).norm() / w.norm())
    assert not any(k.endswith("weight_scale_inv") for k in tensors)
    rep = report
    per_layer = {k: round(v["rel_err"], 4) for k, v in rep["layers"].items()}
    print(f"\n{kind} g{group}: INT4 relative error per layer", per_layer, "overall",
          round(rep["overall_rel_err"], 4), "worst tensor", round(max(errors.values()), 4))
    assert rep["expert_tensors"] == len(errors) == 2 * EXPERTS * 3
    assert set(rep["layers"]) == {"1", "2"} and 0.02 < rep["overall_rel_err"] < 0.2
    assert max(errors.values()) == pytest.approx(max(v["worst_rel_err"] for v in rep["layers"].values()), rel=1e-3)
    assert (out_dir / "tokenizer.json").read_text() == '{"model": "tiny"}'
    assert (out_dir / "generation_config.json").is_file()
    assert json.loads((out_dir / "int4_report.json").read_text())["group_size"] == group


@pytest.mark.parametrize("group", [32, 128])
def test_packing_is_bit_identical_to_compressed_tensors(group):
    """pack.quantize writes what compressed-tensors' own compressor writes from the same (bf16 round-up) scales."""
    gen = torch.Generator().manual_seed(group)
    for rows, cols in ((256, 512), (96, 1024)):
        w = (torch.randn(rows, cols, generator=gen) * 0.02).to(torch.bfloat16).float()
        w[5, 9] = 0.7  # an outlier
        ours, err_sq, norm_sq = pack.quantize(w, group)
        args = quant_args(group)
        scale, zp = compute_dynamic_scales_and_zp(w, args, module=None)
        scale = pack.bf16_round_up(scale).float()
        theirs = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp},
                                                       QuantizationScheme(targets=["Linear"], weights=args))
        assert torch.equal(ours["weight_packed"], theirs["weight_packed"])
        assert torch.equal(ours["weight_shape"], theirs["weight_shape"])
        assert torch.equal(ours["weight_scale"], scale.to(torch.bfloat16))
        back = decompress({f"m.{k}": v for k, v in ours.items()}, "m", group)
        assert err_sq == pytest.approx(float((back - w).square().sum()), rel=1e-3) and norm_sq > 0


def test_quantization_config_is_what_compressed_tensors_builds():
    scheme = QuantizationScheme(targets=["Linear"], weights=quant_args(32))
    built = QuantizationConfig(config_groups={"group_0": scheme}, quant_method="compressed-tensors",
                               format="pack-quantized", quantization_status="compressed",
                               ignore=pack.IGNORE).model_dump(mode="json")
    assert pack.quantization_config(32) == built


@pytest.mark.parametrize("kind", ["glm", "kimi-fp8"])
def test_sglang_picks_its_wna16_moe_scheme(converted, kind, monkeypatch):
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from sglang.srt.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16_moe import (
        CompressedTensorsWNA16MoE,
        CompressedTensorsWNA16TritonMoE,
    )
    from sglang.srt.runtime_context import get_flags

    _, out_dir, _, group = converted[kind]
    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"]) == (4, "int", True, "group")
    assert w["group_size"] == group and "re:.*self_attn.*" in qc["ignore"] and "lm_head" in qc["ignore"]
    config = CompressedTensorsConfig.from_config(qc)
    linear = torch.nn.Linear(2, 2)  # the class name the "Linear" target matches, as in the HF model
    scheme = config.get_moe_scheme(layer=linear, layer_name="model.layers.1.mlp.experts")
    assert type(scheme) is CompressedTensorsWNA16MoE  # Marlin, SGLang's default on Hopper
    monkeypatch.setattr(get_flags().moe, "runner_backend", MoeRunnerBackend.TRITON)
    scheme = config.get_moe_scheme(layer=linear, layer_name="model.layers.2.mlp.experts")
    assert type(scheme) is CompressedTensorsWNA16TritonMoE and scheme.group_size == group
    for ignored in ("model.layers.1.self_attn.o_proj", "model.layers.1.mlp.shared_experts.down_proj",
                    "model.layers.0.mlp.gate_proj", "lm_head"):
        assert config.get_linear_scheme(layer=linear, layer_name=ignored) is None, ignored


@pytest.mark.parametrize("kind", ["glm", "kimi-fp8"])
def test_sglang_fused_int4_moe_kernel_matches_dequantized_reference(converted, kind, monkeypatch):
    """SGLang's Triton INT4 MoE kernel (interpreted, fp16) on the converted experts of layer 1, in the layout
    SGLang's own CompressedTensorsWNA16TritonMoE.process_weights_after_loading makes from the checkpoint."""
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from sglang.srt.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16_moe import (
        CompressedTensorsWNA16TritonMoE,
    )

    from engine_patches.int4_moe.kernel import fused_moe, reference_moe

    _, out_dir, _, group = converted[kind]
    tensors = load_all(out_dir)
    prefix = "model.layers.1.mlp.experts"

    def stacked(proj, key):
        return torch.stack([tensors[f"{prefix}.{e}.{proj}.{key}"] for e in range(EXPERTS)])

    # SGLang's weight loader stores the checkpoint's [rows, in/8] transposed: [E, in/8, rows]
    layer = torch.nn.Module()
    for name, projs in (("w13", ("gate_proj", "up_proj")), ("w2", ("down_proj",))):
        for key in ("weight_packed", "weight_scale"):
            t = torch.cat([stacked(p, key) for p in projs], dim=1).transpose(1, 2).contiguous()
            setattr(layer, f"{name}_{key}", torch.nn.Parameter(t, requires_grad=False))
    qc = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    config = CompressedTensorsConfig.from_config(qc)
    CompressedTensorsWNA16TritonMoE(config, weight_quant=config.target_scheme_map["Linear"]["weights"]) \
        .process_weights_after_loading(layer)
    assert layer.w13_weight_packed.dtype == torch.uint8

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(8, HIDDEN, generator=gen) * 4).to(torch.float16)
    logits = torch.randn(8, EXPERTS, generator=gen)
    topk_w, topk_ids = torch.softmax(logits, -1).topk(2, dim=-1)
    out = fused_moe(x, layer.w13_weight_packed, layer.w2_weight_packed, topk_w, topk_ids.to(torch.int32),
                    layer.w13_weight_scale.half(), layer.w2_weight_scale.half(), group)
    deq = {p: torch.stack([decompress(tensors, f"{prefix}.{e}.{p}", group) for e in range(EXPERTS)])
           for p in ("gate_proj", "up_proj", "down_proj")}
    ref = reference_moe(x, deq["gate_proj"], deq["up_proj"], deq["down_proj"], topk_w, topk_ids)
    max_err = float((out.float() - ref).abs().max())
    rel = float((out.float() - ref).norm() / ref.norm())
    print(f"\n{kind} g{group}: fused INT4 MoE kernel vs dequantized reference: max abs err {max_err:.2e} "
          f"(output max {float(ref.abs().max()):.3f}), relative {rel:.2e}")
    assert rel < 1e-2 and max_err < 1e-2 * float(ref.abs().max())
    # and the kernel really reads the INT4 nibbles: dropping one expert's scales changes the output
    wrong = layer.w13_weight_scale.half().clone()
    wrong[int(topk_ids[0, 0])] *= 2
    out2 = fused_moe(x, layer.w13_weight_packed, layer.w2_weight_packed, topk_w, topk_ids.to(torch.int32),
                     wrong, layer.w2_weight_scale.half(), group)
    assert float((out2.float() - ref).norm() / ref.norm()) > 10 * rel
