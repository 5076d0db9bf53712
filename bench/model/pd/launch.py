"""SGLang 0.5.23 launch commands for a disaggregated plan: every node of every prefill and decode instance, and the
router (sglang-router's `launch_router --pd-disaggregation`). Plain `python -m sglang.launch_server`, or, given
patch flags (bench/model/advice/launch.py patch_flags: KV checksums, FP8 KV scales), `capbench sglang-launch [patch
flags]
-- <the same arguments>`, as a colocated plan's commands are.

Hosts are placeholders the user replaces: PREFILL<i>_NODE0 is the first node of prefill instance i (its
--dist-init-addr and the URL the router reaches it at), likewise DECODE<j>_NODE0."""

from __future__ import annotations

from dataclasses import dataclass

from bench.model.advice.launch import KV_FLAGS, attention_backend, model_path
from bench.model.fits import catalog
from bench.model.pd.disagg import Answer, Shape, chunk, pd_mem_fraction

PORT, BOOTSTRAP_PORT, DIST_PORT, ROUTER_PORT = 30000, 8998, 5000, 8000
TRANSFER_BACKENDS = ("mooncake", "nixl")


@dataclass(frozen=True)
class Launch:
    role: str  # prefill | decode | router
    instance: int
    node: int
    command: str


def server_args(shape: Shape, role: str, batch_per_rank: int = 0, transfer: str = "mooncake") -> list[str]:
    """launch_server arguments shared by every node of one instance of `role`."""
    dep = shape.deployment(role)
    path, _ = model_path(shape.model, shape.weights, dep.tp)
    args = ["--model-path", path, "--trust-remote-code", "--disaggregation-mode", role,
            "--disaggregation-transfer-backend", transfer, "--tp", str(dep.tp), "--ep", str(dep.ep),
            "--moe-a2a-backend", "deepep", "--deepep-mode", "normal" if role == "prefill" else "low_latency",
            "--kv-cache-dtype", KV_FLAGS[shape.kv_dtype],
            "--attention-backend", attention_backend(shape.model, shape.gpu, shape.kv_dtype, dep.tp),
            "--mem-fraction-static", f"{pd_mem_fraction(shape.model, shape.gpu):.3f}",
            "--enable-metrics", "--host", "0.0.0.0", "--port", str(PORT)]
    if dep.dp > 1:
        args += ["--dp", str(dep.dp), "--enable-dp-attention", "--moe-dense-tp-size", "1", "--enable-dp-lm-head"]
    if shape.two_batch_overlap:
        args.append("--enable-two-batch-overlap")
    if shape.redundant(role):
        args += ["--enable-eplb", "--ep-num-redundant-experts", str(shape.redundant(role))]
    if role == "prefill":
        args += ["--chunked-prefill-size", str(chunk(shape) * dep.dp),
                 "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    elif batch_per_rank:
        args += ["--max-running-requests", str(batch_per_rank * dep.dp),
                 "--cuda-graph-max-bs-decode", str(batch_per_rank)]
    if shape.context:
        args += ["--context-length", str(shape.context)]
    return args


def _host(role: str, instance: int) -> str:
    return f"{role.upper()}{instance}_NODE0"


def launcher(patches: list[str] | None) -> list[str]:
    """What starts SGLang: capbench's patched launcher when there are patch flags, else SGLang's own module."""
    return ["capbench", "sglang-launch", *patches, "--"] if patches else ["python", "-m", "sglang.launch_server"]


def instance_commands(shape: Shape, role: str, instance: int, batch_per_rank: int = 0,
                      transfer: str = "mooncake", patches: list[str] | None = None) -> list[Launch]:
    dep = shape.deployment(role)
    nodes = max(1, dep.tp // catalog.gpu(shape.gpu).gpus_per_node)
    base = [*launcher(patches), *server_args(shape, role, batch_per_rank, transfer)]
    if nodes == 1:
        return [Launch(role, instance, 0, " ".join(base))]
    return [Launch(role, instance, rank, " ".join([*base, "--nnodes", str(nodes), "--node-rank", str(rank),
                                                   "--dist-init-addr", f"{_host(role, instance)}:{DIST_PORT}"]))
            for rank in range(nodes)]


def router_command(prefill_instances: int, decode_instances: int) -> str:
    args = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for i in range(prefill_instances):
        args += ["--prefill", f"http://{_host('prefill', i)}:{PORT}", str(BOOTSTRAP_PORT)]
    for j in range(decode_instances):
        args += ["--decode", f"http://{_host('decode', j)}:{PORT}"]
    return " ".join([*args, "--host", "0.0.0.0", "--port", str(ROUTER_PORT)])


def commands(answer: Answer, transfer: str = "mooncake", patches: list[str] | None = None) -> list[Launch]:
    """Every prefill node, every decode node, then the router, for the instance counts the target load needs;
    with patch flags, each server through capbench's patched launcher."""
    out: list[Launch] = []
    for i in range(answer.prefill_instances):
        out += instance_commands(answer.shape, "prefill", i, transfer=transfer, patches=patches)
    for j in range(answer.decode_instances):
        out += instance_commands(answer.shape, "decode", j, answer.batch_per_rank, transfer, patches)
    out.append(Launch("router", 0, 0, router_command(answer.prefill_instances, answer.decode_instances)))
    return out
