"""Converted INT4 checkpoints loaded by SGLang 0.5.23's real Glm4MoeForCausalLM and DeepseekV3ForCausalLM at tp 8:
eight rank processes on CPU (gloo), each building its rank's shard of the model with the server arguments SGLang
resolves on 8x H200 and loading the checkpoint through SGLang's loader (tp_load_worker.py says how). Every
parameter starts as a sentinel; afterwards none may be left.

Not loaded from any checkpoint by design: the W4A16 Marlin scheme's `*_g_idx` / `*_g_idx_sort_indices`, which
its process_weights_after_loading replaces when the checkpoint has no activation order (that step repacks for
Marlin with CUDA kernels and cannot run here)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine_patches.int4_moe.convert import convert
from engine_patches.launch import PatchOptions, build_command
from tests.engine_patches.int4_checkpoints import EXPERTS, LAYERS, MOE_INTER, make_checkpoint

WORLD = 8
WORKER = Path(__file__).with_name("tp_load_worker.py")
REGENERATED = ("_g_idx", "_g_idx_sort_indices")


def sglang_args_from_capbench(model: Path) -> list[str]:
    """What `capbench sglang-launch -- --model-path M --tp 8` hands to sglang.launch_server."""
    argv, _ = build_command(PatchOptions(), ["python", "-m", "sglang.launch_server", "--model-path", str(model),
                                             "--tp", str(WORLD)])
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp8")
    for kind in ("glm", "kimi-fp8"):
        make_checkpoint(root / kind, kind)
        convert(root / kind, root / f"{kind}-int4", group_size=32, tp=WORLD, show_progress=False)
    scenarios = [
        {"name": "glm-sglang-defaults", "args": ["--model-path", str(root / "glm-int4"), "--tp", str(WORLD)]},
        {"name": "glm-capbench", "args": sglang_args_from_capbench(root / "glm-int4")},
        {"name": "kimi-capbench", "args": sglang_args_from_capbench(root / "kimi-fp8-int4")},
    ]
    (root / "scenarios.json").write_text(json.dumps(scenarios))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the eight ranks fork from one process that imported torch and SGLang once (tp_load_worker.py `all`)
    p = subprocess.run([sys.executable, str(WORKER), "all", str(WORLD), str(port), str(root / "scenarios.json"),
                        str(root / "rank{rank}.json")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    return root, scenarios, [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]


def left_unwritten(result: dict) -> dict:
    return {n: c for n, c in result["unwritten"].items() if not n.endswith(REGENERATED)}


def test_capbench_adds_the_unfusing_flag_for_glm_only(loads):
    _, scenarios, _ = loads
    args = {s["name"]: s["args"] for s in scenarios}
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
    root, _, ranks = loads
    name = "model.layers.1.mlp.shared_experts.down_proj.weight"
    index = json.loads((root / "glm-int4" / "model.safetensors.index.json").read_text())
    with safe_open(root / "glm-int4" / index["weight_map"][name], "pt") as f:
        full = f.get_tensor(name)
    share = MOE_INTER // WORLD
    for r, rank in enumerate(ranks):
        expected = float(full[:, r * share:(r + 1) * share].double().sum())
        assert rank["glm-capbench"]["sums"][name] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert torch.is_tensor(full) and full.dtype == torch.bfloat16
