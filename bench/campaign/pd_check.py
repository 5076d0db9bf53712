"""What the PD model says about a campaign's disaggregated deployment: whether each role fits its GPUs, whether a
decode rank's KV pool holds its batch and each load's longest request (checked before anything launches, one line
per problem), and the disaggregated shape (bench/model/pd/disagg.py) that bench/model/pd/simulate.py plays for the
cell's predicted column.

The PD model plays P prefill and D decode instances of one shape behind a router that splits the load evenly
(each instance of a role takes total / count), each instance with expert parallelism over all its GPUs, decode
with DP attention over all of them (dp = ep = tp), prefill with DP attention or TP attention (dp = tp or 1): the
shapes bench/model/pd/search.py searches. The static memory fraction and max running requests of each role are
modelled; a deployment of another shape, or with a flag that changes serving and that the model does not know, is
"not predicted" (its capacity is still checked).
"""

from __future__ import annotations

import itertools

from bench.campaign.pd_launch import plan
from bench.campaign.pd_spec import Role
from bench.campaign.spec import DeploymentSpec, Load
from bench.errors import BadInput
from bench.model import Deployment, catalog, load_workload
from bench.model import capacity as memory
from bench.model.pd import disagg

# flags the shape (or nothing it predicts) covers: the DeepEP / EPLB / two-batch-overlap setup of a PD plan
SHAPED = {"--enable-eplb", "--enable-two-batch-overlap", "--enable-dp-attention", "--moe-a2a-backend",
          "--deepep-mode", "--ep-num-redundant-experts", "--moe-dense-tp-size", "--enable-dp-lm-head",
          "--context-length", "--disaggregation-ib-device", "--trust-remote-code", "--enable-metrics",
          "--log-level", "--served-model-name", "--api-key", "--log-requests", "--download-dir", "--load-format",
          "--tokenizer-path", "--revision", "--cuda-graph-max-bs-decode"}
# flags whose value the shape carries per role (disagg.Shape.mem_fraction, .max_running)
MODELLED = {"--mem-fraction-static", "--max-running-requests"}


def flag_values(role: Role) -> dict[str, str | None]:
    """The role's flags as name -> value (None for a switch)."""
    out: dict[str, str | None] = {}
    flags = list(role.flags)
    for i, f in enumerate(flags):
        if not f.startswith("--"):
            continue
        name, eq, value = f.partition("=")
        nxt = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        out[name] = value if eq else nxt
    return out


def shape(dep: DeploymentSpec) -> tuple[disagg.Shape | None, str]:
    """(the shape of one prefill and one decode instance that the PD simulator plays, "") or (None, why not
    predicted); dep.pd's counts say how many instances of each."""
    pre, dec = dep.pd.prefill, dep.pd.decode
    if not dec.dp == dec.ep == dec.tp or pre.ep != pre.tp or pre.dp not in (1, pre.tp):
        return None, ("not predicted: the PD model has decode with dp = ep = tp, prefill with ep = tp and dp = tp "
                      "or 1")
    pf, df = flag_values(pre), flag_values(dec)
    flags = {**pf, **df}
    unknown = sorted(f for f in flags if f not in SHAPED | MODELLED)
    if unknown:
        return None, f"not predicted: the PD model does not model {', '.join(unknown)}"
    context = flags.get("--context-length")
    try:
        return disagg.Shape(dep.model, dep.gpu, pre.tp, dec.tp, dep.kv_dtype, dep.weights,
                            eplb="--enable-eplb" in flags, context=int(context) if context else None,
                            prefill_dp_attention=pre.dp > 1,
                            two_batch_overlap="--enable-two-batch-overlap" in flags,
                            mem_fraction=(_number(pf, "--mem-fraction-static", float),
                                          _number(df, "--mem-fraction-static", float)),
                            max_running=(_number(pf, "--max-running-requests", int),
                                         _number(df, "--max-running-requests", int))), ""
    except (ValueError, TypeError) as e:
        return None, f"not predicted: {e}"


def _number(flags: dict[str, str | None], name: str, kind: type) -> float | int | None:
    value = flags.get(name)
    return kind(value) if value else None


def role_deployment(dep: DeploymentSpec, role: Role) -> Deployment:
    """One instance of the role as SGLang's memory arithmetic sees it (the flags it knows applied)."""
    f = flag_values(role)
    frac = f.get("--mem-fraction-static")
    return Deployment(catalog.model(dep.model), catalog.gpu(dep.gpu), role.tp, role.dp, dep.kv_dtype, dep.weights,
                      int(f["--context-length"]) if f.get("--context-length") else None,
                      mem_fraction=float(frac) if frac else disagg.pd_mem_fraction(dep.model, dep.gpu), ep=role.ep,
                      max_running=int(f["--max-running-requests"]) if f.get("--max-running-requests") else None)


def fit_problems(where: str, dep: DeploymentSpec, loads: list[Load]) -> list[str]:
    """One line per problem: a role whose weights leave no KV cache, a decode rank whose KV pool cannot hold the
    longest request of a load, or the batch the decode flags ask for (--max-running-requests, per rank) at a
    load's mean length. SGLang's default batch is not checked: it admits only what the pool holds."""
    out = []
    try:
        pre, dec = role_deployment(dep, dep.pd.prefill), role_deployment(dep, dep.pd.decode)
    except (BadInput, ValueError) as e:
        return [f"{where}: {e}"]
    for role, d in (("prefill", pre), ("decode", dec)):
        c = memory.capacity(d, with_ratios=False)
        if not c.fits:
            out.append(f"{where} {role}: {dep.model} ({dep.weights} weights, {dep.kv_dtype} KV) does not fit "
                       f"{d.tp}x {dep.gpu}: {c.weight_bytes_per_gpu / 2**30:,.1f} GiB of weights per GPU at a "
                       f"static memory fraction of {c.mem_fraction_static:.3g} leave no room for a KV cache")
    c = memory.capacity(dec, with_ratios=False)
    if not c.fits:
        return out
    pool, batch = c.kv_pool_tokens, c.max_running_requests // dec.dp
    given = dec.max_running is not None  # SGLang's own estimate only admits what the pool holds
    s, _ = shape(dep)
    if s is not None and s.eplb:  # EPLB's redundant experts take their weight memory from each decode rank's pool
        pool = disagg.decode_pool(s).tokens_per_rank
    for load in loads:
        try:
            ln = disagg.lengths(load_workload(load.workload))
        except (BadInput, ValueError, AttributeError):
            continue  # a workload the PD model cannot draw (ShareGPT): its lengths are not known here
        if ln.longest > pool:
            out.append(f"{where} decode: a decode rank's KV pool of {pool:,} tokens cannot hold the longest request "
                       f"of load {load.name} ({ln.longest:,} tokens)")
        elif given and batch * (ln.prompt + ln.output) > pool:
            out.append(f"{where} decode: a decode rank's batch of {batch:,} requests (max running requests per rank) "
                       f"at load {load.name}'s mean length ({ln.prompt + ln.output:,.0f} tokens) needs "
                       f"{batch * (ln.prompt + ln.output):,.0f} tokens; its KV pool holds {pool:,} (set "
                       f"--max-running-requests to at most {pool // (ln.prompt + ln.output) * dec.dp:,.0f})")
    return out


def port_problems(where: str, dep: DeploymentSpec) -> list[str]:
    """One line per port two launches would take on one host: every role's HTTP port, the prefill bootstrap ports,
    the multi-node instances' dist-init ports and the router's, placed exactly as the launch places them
    (pd_launch.plan; a free port of this host stands for itself and collides with nothing)."""
    taken: dict[tuple[str, int], str] = {}
    out = []
    for part in plan(dep, free=itertools.count(-1, -1).__next__):
        if not part.serves:
            continue  # an instance's other nodes bind nothing of these
        uses = [("port", part.port)]
        args = dict(zip(part.argv, part.argv[1:], strict=False))
        if "--disaggregation-bootstrap-port" in args:
            uses.append(("bootstrap port", int(args["--disaggregation-bootstrap-port"])))
        if "--dist-init-addr" in args:
            uses.append(("dist-init port", int(args["--dist-init-addr"].rpartition(":")[2])))
        for what, port in uses:
            if port < 0:
                continue
            if (part.host, port) in taken:
                out.append(f"{where}: {part.label}'s {what} {port} on {part.host} is {taken[part.host, port]}'s too")
            else:
                taken[part.host, port] = f"{part.label}'s {what}"
    return out
