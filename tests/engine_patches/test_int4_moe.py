"""INT4 expert conversion on tiny GLM-shaped (BF16) and Kimi-shaped (FP8 block-128) checkpoints:
compressed-tensors' decompressor, SGLang's scheme selection, and SGLang's fused INT4 MoE Triton kernel."""

import json

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationScheme
from safetensors import safe_open

from engine_patches.int4_moe.convert import EXPERT_WEIGHT, convert, quant_args
from tests.engine_patches.int4_checkpoints import EXPERTS, make_checkpoint


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(kind, group) -> (source weights, output dir, report): converted once for the module."""
    out = {}
    for kind, group in (("glm", 32), ("kimi-fp8", 128)):
        root = tmp_path_factory.mktemp(f"{kind}-{group}")
        weights = make_checkpoint(root / "in", kind)
        report = convert(root / "in", root / "out", group_size=group, show_progress=False)
        out[kind] = (weights, root / "out", report, group)
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
            assert name in tensors and tensors[name].dtype == torch.bfloat16
            assert torch.equal(tensors[name].float(), w.to(torch.bfloat16).float()), name
            continue
        assert name not in tensors and tensors[m["module"] + ".weight_packed"].dtype == torch.int32
        w_hat = decompress(tensors, m["module"], group)
        scale = tensors[m["module"] + ".weight_scale"].float().repeat_interleave(group, 1)
        # symmetric INT4: every weight within half a step of its group's grid, plus the bf16 rounding of the
        # decompressed value (compressed-tensors returns the scale's dtype)
        assert ((w_hat - w).abs() <= scale / 2 + w.abs() * 2**-8 + 1e-7).all(), name
        errors[name] = float((w_hat - w).norm() / w.norm())
    assert not any(k.endswith("weight_scale_inv") for k in tensors)
    rep = report.to_json()
    per_layer = {k: round(v["rel_err"], 4) for k, v in rep["layers"].items()}
    print(f"\n{kind} g{group}: INT4 relative error per layer", per_layer, "overall",
          round(rep["overall_rel_err"], 4), "worst tensor", round(max(errors.values()), 4))
    assert rep["expert_tensors"] == len(errors) == 2 * EXPERTS * 3
    assert set(rep["layers"]) == {"1", "2"} and 0.02 < rep["overall_rel_err"] < 0.2
    assert max(errors.values()) == pytest.approx(max(v["worst_rel_err"] for v in rep["layers"].values()), rel=1e-3)
    assert (out_dir / "tokenizer.json").read_text() == '{"model": "tiny"}'
    assert (out_dir / "generation_config.json").is_file()
    assert json.loads((out_dir / "int4_report.json").read_text())["group_size"] == group


def test_refuses_bad_input(converted, tmp_path):
    _, out_dir, _, _ = converted["glm"]
    with pytest.raises(ValueError, match="group-size"):
        convert(out_dir, tmp_path / "x", group_size=64, show_progress=False)
    with pytest.raises(ValueError, match="not empty"):
        convert(out_dir, out_dir.parent / "in", group_size=32, show_progress=False)
    with pytest.raises(ValueError, match="no config.json"):
        convert(tmp_path, tmp_path / "y", group_size=32, show_progress=False)
