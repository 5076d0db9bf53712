"""Build SGLang 0.5.23's real MTP draft models (Glm4MoeForCausalLMNextN, DeepseekV3ForCausalLMNextN) and their
targets on CPU at tp 1 (gloo), with capbench's FP8-scales patches installed, and report what each attention module
got. Usage: python nextn_worker.py CASES.json OUT.json (see test_fp8_scales_mtp.py). A subprocess because it
initialises torch.distributed and SGLang's process-wide config."""

import json
import socket
import sys

import torch

# PyPI's torchvision is a CUDA build; SGLang's config package imports it (tests only: see tests/conftest.py)
_tv = torch.library.Library("torchvision", "DEF")
_tv.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_tv.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def build(model_dir: str, draft: bool, first: bool):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.moe.utils import resolve_shared_experts_config
    from sglang.srt.layers.rotary_embedding import base as rope
    from sglang.srt.model_loader import loader
    from sglang.srt.models.deepseek_nextn import DeepseekV3ForCausalLMNextN
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.glm4_moe import Glm4MoeForCausalLM
    from sglang.srt.models.glm4_moe_nextn import Glm4MoeForCausalLMNextN
    from sglang.srt.runtime_context import SpawnRanks, get_model, publish
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(["--model-path", model_dir, "--device", "cpu", "--trust-remote-code"])
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    if first:
        from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(backend="gloo")
    config = ModelConfig.from_server_args(server_args).hf_config
    glm = config.architectures[0].startswith("Glm4Moe")
    cls = {(True, False): Glm4MoeForCausalLM, (True, True): Glm4MoeForCausalLMNextN,
           (False, False): DeepseekV3ForCausalLM, (False, True): DeepseekV3ForCausalLMNextN}[(glm, draft)]
    rope._is_cpu = True  # the rotary cache's CPU path instead of vllm's kernel
    shared = resolve_shared_experts_config(cls, config, None)
    with loader.set_default_torch_dtype(torch.bfloat16), get_model().override(shared_experts=shared):
        return cls(config=config, quant_config=None)


def attention_modules(model):
    layers = [model.model.decoder] if hasattr(model.model, "decoder") else list(model.model.layers)
    for layer in layers:
        attn = layer.self_attn
        yield getattr(attn, "attn_mqa", None) or attn.attn


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    from engine_patches.fp8_scales import loading, recorder
    from engine_patches.fp8_scales.scales_file import E4M3_MAX

    loading.install()
    recs = recorder.install(cases["amax_path"], interval_s=0.0)
    out, first = {}, True
    for case in cases["cases"]:
        model = build(case["model_dir"], case["draft"], first)
        first = False
        row = {"class": type(model).__name__, "layer_ids": [a.layer_id for a in attention_modules(model)]}
        model.load_kv_cache_scales(case["scales"])
        row["k_scale"] = [None if a.k_scale is None else float(a.k_scale) for a in attention_modules(model)]
        row["mla_scales"] = {str(k): v for k, v in loading.MLA_SCALES.items()}
        if case.get("record"):  # a BF16 write through SGLang's pool by this model's first attention module
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

            attn = next(attention_modules(model))
            pool = MHATokenToKVPool(64, 16, torch.bfloat16, attn.tp_k_head_num, attn.head_dim, 1, "cpu", False)
            k = torch.full((4, attn.tp_k_head_num, attn.head_dim), case["record"], dtype=torch.bfloat16)
            pool.set_kv_buffer(attn, torch.arange(16, 20), k, k / 2)
            row["recorded"] = recs["mha"].snapshot()
        out[case["name"]] = row
    out["e4m3_max"] = E4M3_MAX
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
