"""Converted INT4 checkpoints loaded by SGLang 0.5.23's real Glm4MoeForCausalLM and DeepseekV3ForCausalLM at tp 8:
eight rank processes on CPU (gloo), each building its rank's shard of the model with the server arguments SGLang
resolves on 8x H200 and loading the checkpoint through SGLang's loader (tp_load_worker.py says how). Every
parameter starts as a sentinel; afterwards none may be left.

Not loaded from any checkpoint by design: the W4A16 Marlin scheme's `*_g_idx` / `*_g_idx_sort_indices`, which
its process_weights_after_loading replaces when the checkpoint has no activation order (that step repacks for
Marlin with CUDA kernels and cannot run here)."""

import json

import pytest
import torch
from safetensors import safe_open

from tests.engine_patches.int4_checkpoints import EXPERTS, LAYERS, MOE_INTER
from tests.engine_patches.sglang_loads import REGENERATED, WORLD, int4_models, left_unwritten, scenarios, tp8_loads


@pytest.fixture(scope="module")
def loads():
    """The INT4 models, the scenarios' server arguments, and each rank's results (sglang_loads.py runs the worker
    once per test run for this file and test_expert_formats_sglang_load.py)."""
    return int4_models(), {s["name"]: s["args"] for s in scenarios()}, tp8_loads()


def test_capbench_adds_the_unfusing_flag_for_glm_only(loads):
    _, args, _ = loads
    assert "--disable-shared-experts-fusion" in args["glm-capbench"]
    assert "--disable-shared-experts-fusion" not in args["kimi-capbench"]  # DeepseekV2 opts out by itself


def test_sglang_defaults_leave_glms_fused_shared_expert_slot_uninitialised(loads):
    """The failure the launcher prevents: with SGLang's defaults on 8x H200 the shared expert is fused into expert
    slot n_routed_experts, which the W4A16 scheme allocates as packed INT4 and the BF16 checkpoint never fills."""
    _, _, ranks = loads
    for rank in ranks:
        r = rank["glm-sglang-defaults"]
        assert r["resolved"] == {"tp_size": "8", "ep_size": "1", "moe_runner_backend": "auto",
                                 "moe_a2a_backend": "none", "disable_shared_experts_fusion": "False"}
        assert r["quant"] == "compressed_tensors" and not r["fusion_disabled"] and r["num_fused_shared_experts"] == 1
        left = left_unwritten(r)
        for layer in range(1, LAYERS):
            packed = left[f"model.layers.{layer}.mlp.experts.w13_weight_packed"]
            assert packed[0] * (EXPERTS + 1) == packed[1]  # exactly one slot of E + 1: the fused shared expert
            assert f"model.layers.{layer}.mlp.experts.w2_weight_scale" in left


@pytest.mark.parametrize("scenario,model_class", [("glm-capbench", "Glm4MoeForCausalLM"),
                                                  ("kimi-capbench", "DeepseekV3ForCausalLM")])
def test_every_parameter_is_written_through_capbench_launch_args(loads, scenario, model_class):
    _, _, ranks = loads
    for rank in ranks:
        r = rank[scenario]
        assert r["model_class"] == model_class and r["quant"] == "compressed_tensors"
        assert r["fusion_disabled"] and r["num_fused_shared_experts"] == 0
        assert left_unwritten(r) == {}, r["unwritten"]
        assert all(n.endswith(REGENERATED) for n in r["unwritten"])


def test_each_rank_holds_its_slice_of_the_bf16_shared_expert(loads):
    """Written, and with the right values: rank r's shared-expert down_proj is columns [r*32, (r+1)*32)."""
    models, _, ranks = loads
    name = "model.layers.1.mlp.shared_experts.down_proj.weight"
    index = json.loads((models["glm"] / "model.safetensors.index.json").read_text())
    with safe_open(models["glm"] / index["weight_map"][name], "pt") as f:
        full = f.get_tensor(name)
    share = MOE_INTER // WORLD
    for r, rank in enumerate(ranks):
        expected = float(full[:, r * share:(r + 1) * share].double().sum())
        assert rank["glm-capbench"]["sums"][name] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert torch.is_tensor(full) and full.dtype == torch.bfloat16
