"""`capbench quantize-experts` output loaded by SGLang 0.5.23's real Glm4MoeForCausalLM and DeepseekV3ForCausalLM at
tp 8 on CPU (tp_load_worker.py: SGLang's own server-argument parsing, model classes, quantisation configs and weight
loader, every parameter pre-filled with a sentinel): FP8 block-128 and NVFP4 experts made from BF16 (GLM), FP8
block-128 (Kimi K2 Instruct's format) and INT4 (Kimi K2 Thinking's format) inputs. Every parameter must be written,
by the MoE scheme the format is meant for. The tiny models have 1024 expert rows: 128 per rank at tp 8, what FP8's
128-row blocks and NVFP4 Marlin's 64-row tiles need (a real GLM-4.6 has 192 per rank, Kimi K2 256).

MXFP4 is refused before any work: SGLang's own CompressedTensorsConfig cannot pick an MoE scheme for an MXFP4
checkpoint of these architectures, checked here against SGLang itself."""

import json
from pathlib import Path

import pytest
import torch

from bench.model import formats
from engine_patches.int4_moe.convert import REPORT
from tests.engine_patches.int4_checkpoints import EXPERTS, HIDDEN, cached_checkpoint, make_checkpoint
from tests.engine_patches.sglang_loads import FORMAT_CHAINS, FORMAT_ROWS, REGENERATED, WORLD, left_unwritten, tp8_loads

ROWS = FORMAT_ROWS
# Fp8Config gives DeepSeek's attention FP8 KV-cache scales, created at -1 (invalid) and set to 1.0 after loading
# when the checkpoint has none (layers/quantization/kv_cache.py BaseKVCacheMethod): not a checkpoint tensor
KV_SCALES = (".k_scale", ".v_scale")
CASES = {  # scenario (its input and conversion chain: sglang_loads.FORMAT_CHAINS): (model class, MoE scheme)
    "glm-bf16-int4-g128": ("Glm4MoeForCausalLM", "CompressedTensorsWNA16MoE"),
    "glm-bf16-fp8": ("Glm4MoeForCausalLM", "Fp8MoEMethod"),
    "glm-bf16-nvfp4": ("Glm4MoeForCausalLM", "CompressedTensorsW4A16Nvfp4MoE"),
    "kimi-fp8-fp8": ("DeepseekV3ForCausalLM", "Fp8MoEMethod"),
    "kimi-int4-fp8": ("DeepseekV3ForCausalLM", "Fp8MoEMethod"),
    "kimi-int4-nvfp4": ("DeepseekV3ForCausalLM", "CompressedTensorsW4A16Nvfp4MoE"),
}


@pytest.fixture(scope="module")
def loads():
    """Each conversion step's report, named by its chain, and each rank's results (sglang_loads.py runs the worker
    once per test run for this file and test_int4_sglang_load.py)."""
    assert set(CASES) == set(FORMAT_CHAINS)
    reports = {}
    for kind, chain in FORMAT_CHAINS.values():
        for i in range(1, len(chain) + 1):
            step = cached_checkpoint(kind, chain[:i], moe_inter=ROWS, tp=WORLD)
            reports["-".join([kind, *chain[:i]])] = json.loads((step / REPORT).read_text())
    return reports, tp8_loads()


@pytest.mark.parametrize("scenario", list(CASES))
def test_every_parameter_is_written_by_the_formats_moe_scheme(loads, scenario):
    _, ranks = loads
    model_class, moe_scheme = CASES[scenario]
    for rank in ranks:
        r = rank[scenario]
        assert r["model_class"] == model_class and r["moe_scheme"] == moe_scheme
        assert {n: c for n, c in left_unwritten(r).items() if not n.endswith(KV_SCALES)} == {}, r["unwritten"]
        assert r["num_fused_shared_experts"] == 0  # the BF16 shared expert stays its own layer


CATALOG_FORMAT = {"int4-g128": "int4-g128", "fp8-block128": "fp8-block128", "nvfp4": "nvfp4-w4a16"}


@pytest.mark.parametrize("scenario", list(CASES))
def test_bytes_per_weight_are_what_sglang_allocates(loads, scenario):
    """The capacity model's bytes per expert weight (data/expert_formats.yaml, with scales) against the bytes of the
    parameters SGLang's MoE scheme allocates for one layer on one rank (less the Marlin-regenerated g_idx and the
    INT4 shape records, which SGLang frees or keeps on the side)."""
    _, ranks = loads
    fmt = CATALOG_FORMAT[FORMAT_CHAINS[scenario][1][-1]]
    weights = EXPERTS * 3 * HIDDEN * ROWS // WORLD
    for rank in ranks:
        held = sum(b for n, b in rank[scenario]["expert_bytes"].items()
                   if not n.endswith(REGENERATED) and not n.endswith("weight_shape"))
        assert held / weights == pytest.approx(formats.bytes_per_weight(fmt), rel=2e-3)


def test_the_expert_tensors_have_the_dtypes_and_shapes_sglang_made(loads):
    _, ranks = loads
    dtypes = ranks[0]["glm-bf16-nvfp4"]["dtypes"]
    assert dtypes["model.layers.1.mlp.experts.w13_weight_packed"] == "uint8"
    assert dtypes["model.layers.1.mlp.experts.w13_weight_scale"] == "float8_e4m3fn"
    assert dtypes["model.layers.1.mlp.experts.w13_weight_global_scale"] == "float32"
    fp8 = ranks[0]["kimi-int4-fp8"]["dtypes"]
    assert fp8["model.layers.1.mlp.experts.w13_weight"] == "float8_e4m3fn"
    assert fp8["model.layers.1.mlp.experts.w13_weight_scale_inv"] == "float32"
    assert fp8["model.layers.1.mlp.shared_experts.gate_up_proj.weight"] == "bfloat16"  # ignored: kept BF16


def test_conversion_reports_say_what_each_format_loses(loads):
    reports, _ = loads
    assert reports["glm-fp8-block128"]["overall_rel_err"] < 0.04  # e4m3: 3 mantissa bits
    assert 0.05 < reports["glm-nvfp4"]["overall_rel_err"] < 0.15  # e2m1 with fp8 group-16 scales
    assert reports["kimi-fp8-fp8-block128"]["overall_rel_err"] == 0.0  # the same 128x128 blocks: exact
    assert reports["kimi-fp8-int4-g32-nvfp4"]["source_format"] == "int4 (pack-quantized)"
    assert reports["kimi-fp8-int4-g32-nvfp4"]["expert_tensors"] == 2 * EXPERTS * 3  # two MoE layers


@pytest.mark.parametrize("activations", [None, "mxfp4"])
def test_sglang_has_no_moe_scheme_for_an_mxfp4_checkpoint_of_these_models(activations):
    """Why --format mxfp4 is refused: on a CUDA build SGLang's own compressed-tensors config finds no MoE scheme for
    an MXFP4 layer, W4A16 or W4A4 (only kimi_k3.py swaps in Mxfp4Config; DeepseekV2 and GLM-4 do not): it raises."""
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    mx = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group", "dynamic": False}
    acts = {**mx, "dynamic": True} if activations else None
    cfg = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": mx, "input_activations": acts,
                                      "format": "mxfp4-pack-quantized"}}})
    with pytest.raises((RuntimeError, AttributeError, NotImplementedError)):
        cfg.get_moe_scheme(torch.nn.Linear(1, 1), "model.layers.1.mlp.experts")


def test_quantize_experts_refuses_mxfp4_with_sglangs_reason(tmp_path):
    from engine_patches.int4_moe.convert import plan

    make_checkpoint(tmp_path / "glm", "glm")
    with pytest.raises(ValueError, match="does not load MXFP4 experts for DeepseekV3ForCausalLM or Glm4MoeForCausal"):
        plan(tmp_path / "glm", tmp_path / "out", fmt="mxfp4")
    assert not Path(tmp_path / "out").exists()
