"""What the model says about a campaign's deployments: whether each fits (before anything launches), and its answer
to a cell's sweep.

The model is told the SGLang flags it can model (MODELLED: the static memory fraction, page size, max running
requests, context length); a deployment with any other flag that changes what it serves (chunked prefill size,
a disabled radix cache, ...) is "not predicted" instead of being compared as if the flag were not there.
"""

from __future__ import annotations

import math
from dataclasses import replace

from bench.campaign import pd_check
from bench.campaign.spec import Campaign, DeploymentSpec, Load
from bench.campaign.stage import Stage
from bench.errors import BadInput
from bench.model import Deployment, interval, load_workload, pd_simulate, simulate, usd_per_million, within_slo
from bench.model import capacity as memory
from bench.sweep import Search, sweep

MODEL_STAGES = 40  # the simulator's sweep is cheap: it goes on until the SLO breaks
WARMUP_SHARE = 0.25  # of a stage's duration, run before it and not measured: the simulator's first 20 %
MODELLED = {"--mem-fraction-static": ("mem_fraction", float), "--page-size": ("page_size", int),
            "--max-running-requests": ("max_running", int), "--context-length": ("context", int)}
# flags that change nothing the model predicts (logging, names, reporting, loading)
NEUTRAL = {"--trust-remote-code", "--enable-metrics", "--enable-cache-report", "--log-level", "--served-model-name",
           "--api-key", "--disable-shared-experts-fusion", "--log-requests", "--download-dir", "--load-format",
           "--tokenizer-path", "--revision"}


def modelled(dep: DeploymentSpec) -> tuple[Deployment | None, str]:
    """(what the model predicts for, "") or (None, why not predicted)."""
    if dep.model is None:
        return None, "no catalog model (a URL of unknown make)"
    if dep.pd is not None:  # the PD simulator plays its shape; this is the decode instance, for price and bands
        s, why = pd_check.shape(dep)
        return (s.deployment("decode"), "") if s else (None, why)
    try:
        d = dep.deployment()
        flags = [str(f) for f in dep.sglang.get("flags", [])]
        changes, unknown = {}, []
        i = 0
        while i < len(flags):
            name, _, inline = flags[i].partition("=")
            has_value = not inline and i + 1 < len(flags) and not flags[i + 1].startswith("--")
            value = inline or (flags[i + 1] if has_value else None)
            i += 2 if has_value else 1
            if name in MODELLED and value is not None:
                field, kind = MODELLED[name]
                changes[field] = kind(value)
            elif name.startswith("--") and name not in NEUTRAL:
                unknown.append(name)
        if unknown:
            return None, f"not predicted: the model does not model {', '.join(unknown)}"
        if "dp" in dep.sglang or "ep" in dep.sglang:
            changes.update(dp=int(dep.sglang.get("dp", 1)), ep=int(dep.sglang.get("ep", 1)))
        return (replace(d, **changes) if changes else d), ""
    except (BadInput, ValueError) as e:
        return None, f"not predicted: {e}"


def fit_problems(campaign: Campaign) -> list[str]:
    """One line per deployment that cannot fit its GPUs (SGLang's memory arithmetic, with the flags it models); for
    a disaggregated one, per role, and whether a decode rank's KV pool holds its batch (bench/campaign/pd_check.py)."""
    out = []
    for i, dep in enumerate(campaign.deployments):
        if dep.pd is not None:
            out += pd_check.fit_problems(f"deployments[{i}] ({dep.name})", dep, campaign.loads)
            continue
        d, why = modelled(dep)
        if d is None:
            if dep.model is not None and "does not model" not in why:
                out.append(f"deployments[{i}] ({dep.name}): {why.removeprefix('not predicted: ')}")
            continue
        c = memory.capacity(d)
        if not c.fits:
            out.append(f"deployments[{i}] ({dep.name}): {dep.model} ({dep.weights} weights, {dep.kv_dtype} KV) does "
                       f"not fit {dep.gpus}x {dep.gpu}: {c.weight_bytes_per_gpu / 2**30:,.1f} GiB of weights per GPU "
                       f"at a static memory fraction of {c.mem_fraction_static:.3g} leave no room for a KV cache "
                       f"(short by {c.short_by_bytes_per_gpu / 2**30:,.1f} GiB per GPU)")
    return out


def check_fits(campaign: Campaign, source: str) -> None:
    """BadInput listing every deployment that cannot fit its GPUs (the CLI prints it and exits 2)."""
    problems = fit_problems(campaign)
    if problems:
        raise BadInput(f"{source}: {len(problems)} deployment(s) cannot fit their GPUs\n" + "\n".join(problems))


def predicted(dep: DeploymentSpec, load: Load, search: Search) -> dict:
    """The model's answer to the same question: the same sweep (rates, stage length in the deployment's time,
    warm-up, the load's concurrency cap) played by the simulator for this deployment, workload and SLO; its $ per 1M
    output tokens."""
    d, why = modelled(dep)
    none = {"predicted_rps": None, "predicted_usd_per_m": None}
    if load.profile != "sweep":
        return none
    if dep.kv_checksum != "off":
        return {**none, "not_predicted": "not predicted: the model has no KV checksum cost"}
    if d is None:
        return {**none, "not_predicted": why}
    wl = load_workload(load.workload)
    horizon = (1 + WARMUP_SHARE) * load.duration_s * dep.time_scale
    # a disaggregated twin or launch: its prefill and decode instances in virtual time
    pd = pd_check.shape(dep)[0] if dep.pd is not None else dep.pd_shape()

    cap = load.max_concurrency
    if pd and cap:
        return {**none, "not_predicted": "not predicted: the disaggregated model takes no concurrency cap"}

    def stage(rate: float) -> Stage:
        n = max(1, math.ceil(rate * horizon))
        p = pd_simulate.run(pd, wl, rate, n, min_seconds=horizon) if pd else simulate.run(
            d, wl, rate, n, min_seconds=horizon, concurrency=cap)
        # the simulator gives percentiles, not each request: within the SLO (a capped client's wait counted), all count
        met = within_slo(p, load.slo, cap)
        return Stage(rate, "", {"slo_attainment": 1.0 if met else 0.0, "output_tps": p.output_tok_s}, met, "")

    best = sweep(stage, replace(search, start=load.sweep.start, max_stages=MODEL_STAGES)).best
    tps = best.summary["output_tps"] if best else 0.0
    rps = best.rate if best else 0.0
    band = interval.predicted_range(d.model.id, d.gpu.id, d.weights, "output_tok_s", rps) if rps else None
    return {"predicted_rps": rps, "predicted_output_tps": tps,
            "predicted_rps_low": band[0] if band else None, "predicted_rps_high": band[1] if band else None,
            "predicted_usd_per_m": usd_per_million(d.gpu.price_per_gpu_hour, dep.gpus, tps) if tps else None}
