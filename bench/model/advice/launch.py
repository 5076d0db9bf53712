"""SGLang 0.5.23 launch commands for a planned deployment, through capbench's patched launcher
(`capbench sglang-launch [patch flags] -- <sglang.launch_server arguments>`, which runs
`python -m sglang.launch_server` with the patches in every SGLang process): one node, and one instance spread
over several nodes (--nnodes / --node-rank / --dist-init-addr)."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from bench.errors import BadInput
from bench.model.fits import backend, catalog, formats
from bench.model.fits.capacity import WEIGHTS

A2A_BACKEND = "none"  # SGLang's default MoE path, the one the performance model prices for EP
KV_FLAGS = {"bf16": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# SGLang 0.5.23 fuses GLM's shared expert into the quantised expert slots by default, and the BF16 shared expert of
# a capbench conversion (INT4, FP8 or NVFP4 experts) cannot load there (engine_patches/int4_moe/layout.py); the
# launcher adds this flag for a local checkpoint, and the commands say it outright.
UNFUSED_SHARED_EXPERT_ARCHS = ("Glm4MoeForCausalLM",)


def expert_ep(model_id: str, tp: int, weights: str) -> int:
    """Expert parallelism a quantised expert format needs at this tp: each MoE rank must hold whole scale groups
    (blocks) of expert rows (moe_intermediate_size / (tp / ep) divisible by the format's group along it: INT4
    groups, FP8's 128-row blocks, NVFP4's 16, MXFP4's 32); 1 when it already does."""
    m = catalog.model(model_id)
    group = formats.group_along_intermediate(formats.weights_format(m, weights))
    if not group:
        return 1
    inter = m.moe_intermediate_size
    return next((ep for ep in (1, 2, 4, 8, 16, 32, 64) if tp % ep == 0 and (inter // (tp // ep)) % group == 0), tp)


def int4_ep(model_id: str, tp: int, weights: str) -> int:
    """expert_ep for the INT4 formats only (1 otherwise): what the INT4 checkpoint is launched with."""
    return expert_ep(model_id, tp, weights) if weights.startswith("int4") else 1


def model_path(model_id: str, weights: str, tp: int = 8) -> tuple[str, str | None]:
    """(--model-path, a note on where that checkpoint comes from, or None for the published one)."""
    m = catalog.model(model_id)
    if weights == "native":
        return m.hf_repo, None
    src = formats.source_of(m, weights)
    if src is not None and src.kind == "shipped":
        return src.hf, f"{formats.weights_format(m, weights)} experts: {src.hf} ({src.publisher})"
    if weights.startswith("int4"):
        ep = expert_ep(model_id, tp, weights)
        parallel = f"--tp {tp}" + (f" --ep {ep}" if ep > 1 else "")
        return f"./{model_id}-{weights}", (f"INT4 experts ({weights}, compressed-tensors W4A16) made from {m.hf_repo} "
                                           f"by `capbench quantize-experts --format {weights} --in <{m.hf_repo} "
                                           f"download> --out ./{model_id}-{weights} {parallel}`")
    if src is not None:
        return f"./{model_id}-{weights}", f"{weights} experts made from {m.hf_repo} by `{src.detail}`"
    return f"./{model_id}-{weights}", f"{weights} checkpoint of {m.hf_repo} (not obtainable: none published)"


def attention_backend(model_id: str, gpu_id: str, kv_dtype: str, tp: int = 8) -> str:
    """The --attention-backend a line names (bench/model/fits/backend.py launch_backend): SGLang's default where it
    keeps
    calibrated FP8 KV scales right, else one that does; the launcher refuses the others."""
    return backend.launch_backend(catalog.model(model_id), catalog.gpu(gpu_id), kv_dtype, tp)


def server_args(model_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None,
                port: int = 30000, dp: int = 1, ep: int = 1, mem_fraction: float | None = None,
                page_size: int | None = None, attention: str | None = None) -> list[str]:
    """The SGLang arguments of the priced deployment: every flag its price rests on (parallelism, KV dtype, the
    attention backend, the KV pool's memory fraction and page size), so that read_back() gives the same
    configuration again."""
    path, _ = model_path(model_id, weights, tp)
    args = ["--model-path", path, "--tp", str(tp)]
    if dp > 1:  # DP attention: SGLang 0.5.23's spelling (--dp --enable-dp-attention is deprecated)
        args += ["--attn-dp-size", str(dp)]
    ep = max(ep, expert_ep(model_id, tp, weights))
    if ep > 1:  # EP over the all-reduce MoE path capbench prices, not an all-to-all (DeepEP) backend
        args += ["--ep", str(ep), "--moe-a2a-backend", A2A_BACKEND]
    args += ["--kv-cache-dtype", KV_FLAGS[kv_dtype]]
    if attention:
        args += ["--attention-backend", attention]
        forced = backend.backend(attention).page_size
        page_size = forced if forced and page_size in (None, 1) else page_size
    if mem_fraction is not None:
        args += ["--mem-fraction-static", f"{mem_fraction:.3f}"]
    if page_size is not None:
        args += ["--page-size", str(page_size)]
    args += ["--trust-remote-code", "--enable-metrics", "--enable-cache-report", "--port", str(port)]
    src, arch = formats.source_of(catalog.model(model_id), weights), catalog.model(model_id).architecture
    if src is not None and src.kind == "capbench" and arch in UNFUSED_SHARED_EXPERT_ARCHS:
        args.append("--disable-shared-experts-fusion")  # capbench's conversions keep the shared expert in BF16
    if context:
        args += ["--context-length", str(context)]
    return args


def patch_flags(kv_dtype: str, kv_checksum: str = "verify", kv_scales: str | None = "kv_scales.json") -> list[str]:
    flags = ["--kv-checksum", kv_checksum]
    if kv_dtype == "fp8_e4m3" and kv_scales:  # SGLang uses per-layer scales for e4m3 only
        flags += ["--kv-scales", kv_scales]
    return flags


@dataclass(frozen=True)
class Launch:
    """What a launch command deploys: the parts of a plan's configuration the command sets."""

    model: str
    tp: int
    dp: int
    ep: int
    kv_dtype: str
    weights: str
    context: int | None
    mem_fraction: float | None
    page_size: int | None
    nodes: int
    attention: str | None = None


def single_node(model_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None, **flags) -> str:
    return " ".join(["capbench", "sglang-launch", *patch_flags(kv_dtype), "--",
                     *server_args(model_id, tp, kv_dtype, weights, context, **flags)])


def multi_node(model_id: str, gpu_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None,
               head: str = "HEAD_NODE_IP:5000", dp: int = 1, ep: int = 1, **flags) -> list[str]:
    """One command per node for one instance over ceil(tp / gpus_per_node) nodes; when tp fits one node, the
    same deployment at twice the tp over two nodes (for a longer context or more KV per instance): DP attention
    and EP that spanned all tp GPUs span all of them again."""
    flags.setdefault("attention", attention_backend(model_id, gpu_id, kv_dtype, tp))
    per_node = catalog.gpu(gpu_id).gpus_per_node
    if tp <= per_node:
        scale = 2 * per_node // tp
        tp, dp, ep = tp * scale, dp * scale if dp == tp else dp, ep * scale if ep == tp else ep
    nodes = math.ceil(tp / per_node)
    base = ["capbench", "sglang-launch", *patch_flags(kv_dtype), "--",
            *server_args(model_id, tp, kv_dtype, weights, context, dp=dp, ep=ep, **flags)]
    return [" ".join([*base, "--nnodes", str(nodes), "--node-rank", str(rank), "--dist-init-addr", head])
            for rank in range(nodes)]


def commands(model_id: str, gpu_id: str, tp: int, kv_dtype: str, weights: str,
             context: int | None = None, **flags) -> tuple[str | None, list[str]]:
    """(one-node command, or None when tp spans nodes; one command per node for one instance over several nodes).
    flags: dp, ep, mem_fraction, page_size and attention (the backend) of the priced configuration."""
    flags.setdefault("attention", attention_backend(model_id, gpu_id, kv_dtype, tp))
    per_node = catalog.gpu(gpu_id).gpus_per_node
    single = single_node(model_id, tp, kv_dtype, weights, context, **flags) if tp <= per_node else None
    return single, multi_node(model_id, gpu_id, tp, kv_dtype, weights, context, **flags)


def priced(model_id: str, gpu_id: str, tp: int, kv_dtype: str, weights: str, context: int | None = None,
           **flags) -> list[str]:
    """The command(s) that deploy exactly the priced configuration: one line on one node, else one per node."""
    single, multi = commands(model_id, gpu_id, tp, kv_dtype, weights, context, **flags)
    return [single] if single else multi


def _flag(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def read_back(line: str) -> Launch:
    """The configuration a launch command deploys, read as SGLang reads its flags (capbench's own lines, or a
    `python -m sglang.launch_server ...` line). The inverse of priced(), checked in tests for every finalist."""
    argv = shlex.split(line, comments=True)
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    path = _flag(argv, ("--model-path", "--model"))
    if not path:
        raise BadInput(f"no --model-path in {line!r}")
    model, weights = _model_of(path)
    attn_dp = int(_flag(argv, ("--attn-dp-size", "--attention-data-parallel-size")) or 1)
    if attn_dp == 1 and "--enable-dp-attention" in argv:
        attn_dp = int(_flag(argv, ("--dp-size", "--dp", "--data-parallel-size")) or 1)
    kv = _flag(argv, ("--kv-cache-dtype",)) or "auto"
    mem, page, ctx = (_flag(argv, (f,)) for f in ("--mem-fraction-static", "--page-size", "--context-length"))
    return Launch(model, int(_flag(argv, ("--tp", "--tp-size", "--tensor-parallel-size")) or 1), attn_dp,
                  int(_flag(argv, ("--ep", "--ep-size", "--expert-parallel-size")) or 1),
                  {v: k for k, v in KV_FLAGS.items()}.get(kv, kv), weights, int(ctx) if ctx else None,
                  float(mem) if mem else None, int(page) if page else None,
                  int(_flag(argv, ("--nnodes",)) or 1), _flag(argv, ("--attention-backend",)))


def _model_of(path: str) -> tuple[str, str]:
    """(model id, weights) of a --model-path: a catalog model's published repo, or ./<model>-<weights>."""
    for m in catalog.models().values():
        if path == m.hf_repo:
            return m.id, "native"
        for fmt in formats.names():
            for src in formats.sources(m, fmt):
                if src.kind == "shipped" and path == src.hf:
                    return m.id, src.weights
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for w in sorted(WEIGHTS, key=len, reverse=True):
        if w != "native" and name.endswith(f"-{w}"):
            try:
                return catalog.model(name.removesuffix(f"-{w}")).id, w
            except BadInput:
                break
    raise BadInput(f"--model-path {path!r} is no catalog model's checkpoint")
