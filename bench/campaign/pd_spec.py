"""A prefill/decode-disaggregated deployment in a campaign file (`disaggregated:`): prefill instances, decode
instances and the router, each role placed on named nodes whose launch templates start it.

    disaggregated:
      model: kimi-k2-thinking           # catalog id; also gpu, kv_dtype, weights, model_path
      kv_checksum: verify               # optional: capbench's patches (also kv_scales, INT4 weights) put
                                        # `capbench sglang-launch` in front of every prefill and decode node
      transfer: mooncake                # the KV transfer backend: mooncake | nixl
      nodes:                            # node name -> launch template (or the name of an operator's template)
        gpu1: {start: "ssh gpu1 {command}", host: gpu1}
        gpu2: {start: "ssh gpu2 {command}", host: gpu2}
      prefill: {count: 1, tp: 8, dp: 8, ep: 8, node: gpu1}
      decode: {count: 1, tp: 8, dp: 8, ep: 8, node: gpu2}
      router: {node: gpu1, port: 8000}

A role's `node` is one name (every node of the role there) or a list, one name per node in launch order (an
instance of tp GPUs spans tp / GPUs-per-node nodes). A role without `node` runs on this host. A role has at most
MAX_INSTANCES instances and MAX_GPUS GPUs (count x tp); ports given count up per instance and stay <= 65535; a
`kv_scales` file must exist here and be the JSON SGLang reads (bench/kv_scales.py). Every problem is one line,
like the rest of the campaign file's (bench/campaign/spec.py); ports that collide on a node are found by
`--check` (bench/campaign/pd_check.py), which places every launch as the launch would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.campaign import flags as server_flags
from bench.campaign import guard
from bench.campaign.templates import NAME, Template, parse_template
from bench.checks import GPUS_MAX, PORT_MAX
from bench.kv_scales import check_scales
from bench.model import catalog

MAX_INSTANCES = guard.HIGHEST["count"]  # of one role (256): LMSYS's largest published PD deployments run a dozen
MAX_GPUS = GPUS_MAX  # of one role, count x tp: the bound of every --tp / gpus option

KEYS = {"model", "model_path", "gpu", "kv_dtype", "weights", "transfer", "nodes", "prefill", "decode", "router",
        "kv_checksum", "kv_scales"}
ROLE_KEYS = {"count", "tp", "dp", "ep", "node", "port", "bootstrap_port", "flags"}
ROUTER_KEYS = {"node", "port", "flags"}
TRANSFERS = ("mooncake", "nixl")
@dataclass(frozen=True)
class Role:
    role: str  # prefill | decode | router
    count: int = 1  # instances
    tp: int = 1
    dp: int = 1
    ep: int = 1
    nodes: tuple[str, ...] = ()  # node names, one per launch in order, or one for all; () = this host
    port: int | None = None  # the first instance's; the next ones count up (default: free ports, 30000 up remotely)
    bootstrap_port: int | None = None  # prefill: the KV bootstrap server's (default 8998 up remotely)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class PDSpec:
    prefill: Role
    decode: Role
    router: Role
    nodes: dict[str, Template | None] = field(default_factory=dict)  # None: an operator's, resolved by name
    node_refs: dict[str, str] = field(default_factory=dict)  # node -> the operator template it names
    transfer: str = "mooncake"
    model_path: str | None = None
    kv_scales: str | None = None  # FP8 KV scales file for capbench sglang-launch --kv-scales, on every node

    def role(self, name: str) -> Role:
        return {"prefill": self.prefill, "decode": self.decode, "router": self.router}[name]


def nodes_per_instance(role: Role, gpu: str) -> int:
    """How many nodes one instance of the role spans: its tp GPUs over the GPU's per-node count."""
    if role.role == "router":
        return 1
    return max(1, math.ceil(role.tp / catalog.gpu(gpu).gpus_per_node))


def parse_pd(problems: list, where: str, raw: object, gpu: str) -> PDSpec | None:
    """The `disaggregated:` mapping (the catalog model, GPU, KV dtype and weights are read by the caller)."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: a mapping with model, nodes, prefill, decode and router is required")
        return None
    for key in raw:
        if key not in KEYS:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(KEYS))})")
    transfer = str(raw.get("transfer", "mooncake"))
    if transfer not in TRANSFERS:
        problems.append(f"{where}.transfer: {transfer!r} is not one of {', '.join(TRANSFERS)}")
    nodes, refs = _nodes(problems, f"{where}.nodes", raw.get("nodes", {}))
    roles = {}
    for name in ("prefill", "decode", "router"):
        roles[name] = _role(problems, f"{where}.{name}", name, raw.get(name), nodes, gpu)
    if None in roles.values():
        return None
    path, scales = raw.get("model_path"), raw.get("kv_scales")
    if scales and (wrong := check_scales(str(scales))) is not None:
        problems.append(f"{where}.kv_scales: {wrong} (the file every prefill and decode node loads)")
    for key, value in (("model_path", path), ("kv_scales", scales)):
        if value is not None:
            guard.check_words(problems, f"{where}.{key}", [value])
    return PDSpec(roles["prefill"], roles["decode"], roles["router"], nodes, refs, transfer,
                  str(path) if path else None, str(scales) if scales else None)


def _nodes(problems: list, where: str, raw: object) -> tuple[dict[str, Template | None], dict[str, str]]:
    if not isinstance(raw, dict):
        problems.append(f"{where}: a mapping of node name -> launch template {{start, stop, host}} (or the name of "
                        "one of the operator's templates) is required")
        return {}, {}
    nodes: dict[str, Template | None] = {}
    refs: dict[str, str] = {}
    for name, t in raw.items():
        if not NAME.match(str(name)):
            problems.append(f"{where}.{str(name)[:80]!r}: a node name of letters, digits, . _ - is required")
        if isinstance(t, str):
            nodes[str(name)], refs[str(name)] = None, t
        else:
            nodes[str(name)] = parse_template(problems, f"{where}.{name}", t)
    return nodes, refs


def _role(problems: list, where: str, name: str, raw: object, nodes: dict, gpu: str) -> Role | None:
    if not isinstance(raw, dict):
        what = "node, port" if name == "router" else "count, tp, dp, ep, node"
        problems.append(f"{where}: a mapping ({what}, ...) is required")
        return None
    known = ROUTER_KEYS if name == "router" else ROLE_KEYS
    for key in raw:
        if key not in known:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    values = {}
    for key in ("count", "tp", "dp", "ep", "port", "bootstrap_port"):
        if key in raw and key in known:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{where}.{key}: a positive whole number is required, got {v!r}")
                return None
            if v > guard.HIGHEST[key]:
                return None  # said by guard.check_ranges
            values[key] = v
    count = values.get("count", 1)
    for key in ("port", "bootstrap_port"):
        if key in values and values[key] + count - 1 > PORT_MAX:
            problems.append(f"{where}.{key}: {count} instance(s) take ports {values[key]} to "
                            f"{values[key] + count - 1}, past {PORT_MAX}")
    if count * values.get("tp", 8) > MAX_GPUS and name != "router":
        problems.append(f"{where}: {count} instance(s) of tp {values.get('tp', 8)} are "
                        f"{count * values.get('tp', 8):,} GPUs; a role has at most {MAX_GPUS:,}")
        return None
    if name != "router":
        tp = values.get("tp", 8)
        values.setdefault("tp", tp)
        if tp % values.get("dp", 1) or tp % values.get("ep", 1):
            problems.append(f"{where}: dp and ep must divide tp (tp {tp}, dp {values.get('dp', 1)}, "
                            f"ep {values.get('ep', 1)})")
    flags = raw.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str | int | float) for f in flags):
        problems.append(f"{where}.flags: a list of arguments is required, e.g. [--mem-fraction-static, 0.8]")
        flags = []
    flags = [str(f) for f in flags]
    guard.check_words(problems, f"{where}.flags", flags)
    if name == "router":
        server_flags.check_router_flags(problems, f"{where}.flags", flags)
    else:
        server_flags.check_server_flags(problems, f"{where}.flags", flags, server_flags.PD_OWN)
    placed = raw.get("node", [])
    placed = [placed] if isinstance(placed, str) else placed
    if not isinstance(placed, list) or not all(isinstance(n, str) for n in placed):
        problems.append(f"{where}.node: a node name or a list of node names is required")
        return None
    for n in placed:
        if n not in nodes:
            problems.append(f"{where}.node: no node named {n!r} (nodes: {', '.join(sorted(nodes)) or 'none'})")
    role = Role(name, flags=tuple(flags), nodes=tuple(placed), **values)
    launches = role.count * nodes_per_instance(role, gpu)
    if len(placed) not in (0, 1, launches):
        problems.append(f"{where}.node: {len(placed)} names for {launches} launches ({role.count} instance(s) of "
                        f"{nodes_per_instance(role, gpu)} node(s)); give one name, or one per launch")
    return role


def resolve(problems: list, where: str, pd: PDSpec, templates: dict[str, Template], inline: bool) -> PDSpec:
    """Each node's template: the operator's of the name it gives; one written in the campaign only if `inline`;
    a role on this host (no node) only if `inline` too (capbench serve launches nothing of its own)."""
    known = ", ".join(sorted(templates)) or "none; capbench serve --templates FILE names them"
    nodes = dict(pd.nodes)
    for name in pd.nodes:
        if name in pd.node_refs:
            ref = pd.node_refs[name]
            if ref not in templates:
                problems.append(f"{where}.nodes.{name}: no launch template named {ref!r} (known: {known})")
            nodes[name] = templates.get(ref)
        elif not inline:
            problems.append(f"{where}.nodes.{name}: refused: a campaign queued on capbench serve carries its own "
                            f"shell command; name one of the operator's launch templates instead (known: {known})")
    if not inline:
        for r in (pd.prefill, pd.decode, pd.router):
            if not r.nodes:
                problems.append(f"{where}.{r.role}.node: refused: a campaign queued on capbench serve would launch "
                                f"the {r.role} on the service's host; place it on a node")
    return PDSpec(pd.prefill, pd.decode, pd.router, nodes, pd.node_refs, pd.transfer, pd.model_path, pd.kv_scales)
