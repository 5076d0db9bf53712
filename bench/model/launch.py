"""SGLang 0.5.23 launch commands for a planned deployment, through capbench's patched launcher
(`capbench sglang-launch [patch flags] -- <sglang.launch_server arguments>`, which runs
`python -m sglang.launch_server` with the patches in every SGLang process): one node, and one instance spread
over several nodes (--nnodes / --node-rank / --dist-init-addr)."""

from __future__ import annotations

import math

from bench.model import catalog

KV_FLAGS = {"bf16": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# SGLang 0.5.23 fuses GLM's shared expert into the INT4 expert slots by default, and the BF16 shared expert of an
# INT4 checkpoint cannot load there (engine_patches/int4_moe/layout.py); the launcher adds this flag for a local
# checkpoint, and the commands say it outright.
UNFUSED_SHARED_EXPERT_ARCHS = ("Glm4MoeForCausalLM",)


def int4_ep(model_id: str, tp: int, weights: str) -> int:
    """Expert parallelism an INT4 checkpoint needs at this tp: each rank must hold whole groups of expert rows
    (moe_intermediate_size / (tp / ep) divisible by the group size); 1 when it already does."""
    if not weights.startswith("int4"):
        return 1
    group, inter = int(weights.removeprefix("int4-g")), catalog.model(model_id).moe_intermediate_size
    return next((ep for ep in (1, 2, 4, 8, 16, 32, 64) if tp % ep == 0 and (inter // (tp // ep)) % group == 0), tp)


def model_path(model_id: str, weights: str, tp: int = 8) -> tuple[str, str | None]:
    """(--model-path, a note on where that checkpoint comes from, or None for the published one)."""
    m = catalog.model(model_id)
    if weights == "native":
        return m.hf_repo, None
    if weights.startswith("int4"):
        group, ep = weights.removeprefix("int4-g"), int4_ep(model_id, tp, weights)
        parallel = f"--tp {tp}" + (f" --ep {ep}" if ep > 1 else "")
        return f"./{model_id}-{weights}", (f"INT4 experts ({weights}, compressed-tensors W4A16) made from {m.hf_repo} "
                                           f"by `capbench quantize-int4 --in <{m.hf_repo} download> --out "
                                           f"./{model_id}-{weights} --group-size {group} {parallel}`")
    return f"./{model_id}-{weights}", f"{weights} checkpoint of {m.hf_repo} (not the published format)"


def server_args(model_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None,
                port: int = 30000) -> list[str]:
    path, _ = model_path(model_id, weights, tp)
    args = ["--model-path", path, "--tp", str(tp),
            "--kv-cache-dtype", KV_FLAGS[kv_dtype], "--trust-remote-code", "--enable-metrics",
            "--enable-cache-report", "--port", str(port)]
    if weights.startswith("int4"):
        ep = int4_ep(model_id, tp, weights)
        args += ["--ep", str(ep)] if ep > 1 else []
        if catalog.model(model_id).architecture in UNFUSED_SHARED_EXPERT_ARCHS:
            args.append("--disable-shared-experts-fusion")
    if context:
        args += ["--context-length", str(context)]
    return args


def patch_flags(kv_dtype: str, kv_checksum: str = "verify", kv_scales: str | None = "kv_scales.json") -> list[str]:
    flags = ["--kv-checksum", kv_checksum]
    if kv_dtype == "fp8_e4m3" and kv_scales:  # SGLang uses per-layer scales for e4m3 only
        flags += ["--kv-scales", kv_scales]
    return flags


def single_node(model_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None) -> str:
    return " ".join(["capbench", "sglang-launch", *patch_flags(kv_dtype), "--",
                     *server_args(model_id, tp, kv_dtype, weights, context)])


def multi_node(model_id: str, gpu_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None,
               head: str = "HEAD_NODE_IP:5000") -> list[str]:
    """One command per node for one instance over ceil(tp / gpus_per_node) nodes; when tp fits one node, the
    same deployment at twice the tp over two nodes (for a longer context or more KV per instance)."""
    per_node = catalog.gpu(gpu_id).gpus_per_node
    if tp <= per_node:
        tp = 2 * per_node
    nodes = math.ceil(tp / per_node)
    base = ["capbench", "sglang-launch", *patch_flags(kv_dtype), "--",
            *server_args(model_id, tp, kv_dtype, weights, context)]
    return [" ".join([*base, "--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr", head])
            for rank in range(nodes)]


def commands(model_id: str, gpu_id: str, tp: int, kv_dtype: str, weights: str,
             context: int | None = None) -> tuple[str | None, list[str]]:
    """(one-node command, or None when tp spans nodes; one command per node for one instance over several nodes)."""
    per_node = catalog.gpu(gpu_id).gpus_per_node
    single = single_node(model_id, tp, kv_dtype, weights, context) if tp <= per_node else None
    return single, multi_node(model_id, gpu_id, tp, kv_dtype, weights, context)
