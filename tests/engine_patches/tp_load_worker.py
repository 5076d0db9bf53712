"""One tensor-parallel rank of a real SGLang 0.5.23 model load on CPU (run 8 of these for tp 8; see
test_int4_sglang_load.py). Usage: python tp_load_worker.py RANK WORLD PORT SCENARIOS.json OUT.json, or with RANK
`all` the WORLD ranks as forks of one process that imported torch and SGLang once (each rank writes OUT.json with
`{rank}` filled in and its log beside it); exits non-zero if any rank failed.

Per scenario (a model directory and SGLang server arguments): SGLang's own parser builds the ServerArgs
(`prepare_server_args`, plus `--device cpu`: the resolution pipeline needs a device, and the fields that decide
shared-expert fusion resolve alike on CPU and sm90 for these architectures), `publish` gives this process its rank,
torch.distributed (gloo) and SGLang's model-parallel groups give the layers their real tp 8 shapes, the
shared-expert fusion decision is SGLang's own `resolve_shared_experts_config` evaluated with an H200's platform
facts (CUDA, capability 9.0), the model is built exactly as `loader._initialize_model` builds it, every parameter
is filled with a sentinel (NaN, or a fixed int32), and `DefaultModelLoader.load_weights_only` loads the checkpoint
through SGLang's weight iterator and the model's own `load_weights`. Reports what the load left unwritten.
"""

import json
import sys

import torch

# PyPI's torchvision is a CUDA build; SGLang's config package imports it (tests only: see tests/conftest.py)
_tv = torch.library.Library("torchvision", "DEF")
_tv.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_tv.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

INT_SENTINEL = -0x2A2A2A2B
BYTE_SENTINELS = (0xA5, 0x5A)  # one-byte parameters (uint8 packed FP4, FP8 weights and scales): written when not both


def _fill(model, byte_sentinel: int) -> None:
    for p in model.parameters():
        if p.element_size() == 1:
            p.data.view(torch.uint8).fill_(byte_sentinel)
        else:
            p.data.fill_(float("nan") if p.dtype.is_floating_point else INT_SENTINEL)


def _moe_scheme(model) -> str | None:
    """The class of the first routed-expert layer's quantisation method (a compressed-tensors scheme if any)."""
    for name, module in model.named_modules():
        if name.endswith("mlp.experts") and hasattr(module, "quant_method"):
            return type(getattr(module, "scheme", None) or module.quant_method).__name__
    return None


def h200_shared_experts_config(model_class, hf_config, quant_config):
    """SGLang's decision as an H200 makes it: the model gates read `_is_cuda` and the device capability."""
    import importlib

    from sglang.srt.layers.moe.utils import resolve_shared_experts_config

    module = importlib.import_module(model_class.__module__)
    saved = module._is_cuda, torch.cuda.get_device_capability
    module._is_cuda, torch.cuda.get_device_capability = True, lambda *a, **k: (9, 0)
    try:
        return resolve_shared_experts_config(model_class, hf_config, quant_config)
    finally:
        module._is_cuda, torch.cuda.get_device_capability = saved


def load(rank: int, world: int, port: int, args: list[str], first: bool) -> dict:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.rotary_embedding import base as rope
    from sglang.srt.model_loader import loader
    from sglang.srt.runtime_context import SpawnRanks, get_model, publish
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args([*args, "--device", "cpu"])
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=rank))
    if first:
        from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(backend="gloo")
    resolved = server_args.resolved_dict()
    model_config = ModelConfig.from_server_args(server_args)
    load_config = LoadConfig(load_format="auto")
    quant_config = loader._get_quantization_config(model_config, load_config)
    model_class, _ = loader.get_model_architecture(model_config)
    shared = h200_shared_experts_config(model_class, model_config.hf_config, quant_config)
    rope._is_cpu = True  # the rotary cache's CPU path instead of vllm's kernel; no weights involved
    with loader.set_default_torch_dtype(model_config.dtype), get_model().override(shared_experts=shared):
        model = model_class(config=model_config.hf_config, quant_config=quant_config)
    default_loader = loader.DefaultModelLoader(load_config)
    lefts = {}
    for byte in BYTE_SENTINELS:  # a second pass only tells one-byte parameters' real 0xA5 bytes from unwritten ones
        _fill(model, byte)
        default_loader.load_weights_only(model, default_loader._get_all_weights(model_config, model),
                                         torch.device("cpu"))
        for name, p in model.named_parameters():
            if p.element_size() == 1:
                left = p.data.view(torch.uint8) == byte
                lefts[name] = left if name not in lefts else lefts[name] & left
            elif name not in lefts:
                lefts[name] = p.isnan() if p.dtype.is_floating_point else p == INT_SENTINEL
        if not any(p.element_size() == 1 for p in model.parameters()):
            break
    unwritten, sums = {}, {}
    for name, p in model.named_parameters():
        left = lefts[name]
        if left.any():
            unwritten[name] = [int(left.sum()), p.numel()]
        if p.dtype.is_floating_point and not left.any():
            sums[name] = float(p.double().sum())
    return {"model_class": model_class.__name__, "quant": quant_config.get_name() if quant_config else None,
            "fusion_disabled": shared.fusion_disabled, "num_fused_shared_experts": shared.num_fused_shared_experts,
            "moe_scheme": _moe_scheme(model),
            "expert_bytes": {n: p.numel() * p.element_size() for n, p in model.named_parameters()
                             if ".layers.1.mlp.experts." in n},
            "dtypes": {n: str(p.dtype).removeprefix("torch.") for n, p in model.named_parameters()},
            "resolved": {k: str(resolved.get(k)) for k in ("tp_size", "ep_size", "moe_runner_backend",
                                                           "moe_a2a_backend", "disable_shared_experts_fusion")},
            "unwritten": unwritten, "sums": sums}


def run_rank(rank: int, world: int, port: int, scenarios_file: str, out_file: str) -> None:
    scenarios = json.loads(open(scenarios_file).read())
    results = {}
    for i, s in enumerate(scenarios):
        results[s["name"]] = load(rank, world, port, s["args"], first=i == 0)
    with open(out_file, "w") as f:
        json.dump(results, f)


def fork_ranks(world: int, port: int, scenarios_file: str, out_pattern: str) -> int:
    """The ranks as forks of this process: SGLang's modules (seconds of CPU each) are imported once, not per rank."""
    from forked import fork_each  # beside this script (its folder is first on sys.path)
    from sglang.srt.configs import model_config  # noqa: F401
    from sglang.srt.model_loader import loader  # noqa: F401
    from sglang.srt.models import deepseek_v2, glm4_moe  # noqa: F401
    from sglang.srt.models.registry import ModelRegistry  # noqa: F401  (every model class: ~2 s a rank)
    from sglang.srt.server_args import prepare_server_args  # noqa: F401

    return fork_each(range(world), out_pattern,
                     lambda rank, out: run_rank(rank, world, port, scenarios_file, out))


def main() -> None:
    rank, world, port, scenarios_file, out_file = sys.argv[1:6]
    if rank == "all":
        sys.exit(fork_ranks(int(world), int(port), scenarios_file, out_file))
    run_rank(int(rank), int(world), int(port), scenarios_file, out_file)


if __name__ == "__main__":
    main()
