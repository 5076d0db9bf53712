"""What the model says about a campaign's deployments: whether each fits (before anything launches), and its answer
to a cell's sweep.

The model is told the SGLang flags it can model (MODELLED: the static memory fraction, page size, max running
requests, context length); a deployment with any other flag that changes what it serves (chunked prefill size,
a disabled radix cache, ...) is "not predicted" instead of being compared as if the flag were not there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from bench.campaign import pd_check
from bench.campaign.spec import Campaign, DeploymentSpec, Load, parse_campaign
from bench.campaign.stage import Stage
from bench.errors import BadInput
from bench.model import (
    Deployment,
    Workload,
    interval,
    load_workload,
    simulate,
    usd_per_million,
    within_slo,
    workload,
)
from bench.model import capacity as memory
from bench.model.pd import simulate as pd_simulate
from bench.sweep import Search, sweep

ANSWER_SAMPLES = 2000
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
            out += pd_check.port_problems(f"deployments[{i}] ({dep.name})", dep)
            out += pd_check.fit_problems(f"deployments[{i}] ({dep.name})", dep, campaign.loads)
            continue
        if (s := dep.pd_shape()) is not None and not (c := memory.capacity(s.deployment("prefill"))).fits:
            out.append(f"deployments[{i}] ({dep.name}) prefill: {dep.model} ({dep.weights} weights) does not fit "
                       f"{s.prefill_gpus}x {dep.gpu}: {c.weight_bytes_per_gpu / 2**30:,.1f} GiB of weights per GPU "
                       f"leave no room for a KV cache")
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


def check_campaign(text: str | bytes, source: str, templates: dict | None = None,
                   inline_templates: bool = False) -> Campaign:
    """`capbench campaign --check`'s whole check, which the Campaigns page and serve's runner run before they queue a
    file: the file's own problems (spec.parse_campaign), then what a launch would hit (check_fits)."""
    campaign = parse_campaign(text, source, templates, inline_templates)
    check_fits(campaign, source)
    return campaign


def check_fits(campaign: Campaign, source: str) -> None:
    """BadInput listing every problem a launch would hit: a deployment that cannot fit its GPUs, a disaggregated
    one's ports that collide on a node (the CLI prints it and exits 2)."""
    problems = fit_problems(campaign)
    if problems:
        raise BadInput(f"{source}: {len(problems)} problem(s) a launch would hit\n" + "\n".join(problems))


def answer_tokens(wl: Workload, context: int) -> float:
    """The workload's mean answer in tokens, as the simulator draws its requests (ANSWER_SAMPLES of them, whatever
    the stage's length, so every stage of a sweep multiplies by the same figure)."""
    reqs = workload.make_requests(wl, 1.0, ANSWER_SAMPLES, 0, simulate.BLOCK, context)
    return sum(r.max_new for r in reqs) / len(reqs)


def predicted_stage(dep: DeploymentSpec, load: Load, rate: float,
                    mean_answer: Callable[[Workload, int], float] = answer_tokens) -> Stage:
    """The simulator playing one stage of the sweep at `rate`: its latencies are those of a stage as long as the
    campaign's (the same warm-up, queues building for as long), judged against the SLO; its output tokens/s is the
    steady-state rate the deployment sustains at that offered load: the requests it serves per second times their
    mean answer, which a stage measures as the output tokens of its measured requests per second of its window
    (bench/campaign/run.py). The simulator's own tokens/s counts only tokens made inside the replay window, which
    in a stage shorter than an answer's latency undercounts (0 for the PD simulator before 2026-12-02)."""
    d, _ = modelled(dep)
    wl = load_workload(load.workload)
    horizon = (1 + WARMUP_SHARE) * load.duration_s * dep.time_scale
    n = max(1, math.ceil(rate * horizon))
    # a disaggregated twin or launch: its prefill and decode instances in virtual time
    pd = pd_check.shape(dep)[0] if dep.pd is not None else dep.pd_shape()
    if pd is not None:
        counts = (dep.pd.prefill.count, dep.pd.decode.count) if dep.pd is not None else (1, 1)
        p = pd_simulate.run(pd, wl, rate, n, min_seconds=horizon, instances=counts, concurrency=load.max_concurrency)
        context = pd.deployment("decode").context_len
    else:
        p = simulate.run(d, wl, rate, n, min_seconds=horizon, concurrency=load.max_concurrency)
        context = d.context_len
    served = 1 - p.rejected / n  # run() offers n requests: rate x horizon
    # the simulator gives percentiles, not each request: within the SLO (a capped client's wait counted), all count
    met = within_slo(p, load.slo, load.max_concurrency)
    tps = rate * served * mean_answer(wl, context)
    q = load.slo.percentile  # the latencies at the SLO's percentile: the predicted curve the report draws
    return Stage(rate, "", {"slo_attainment": 1.0 if met else 0.0, "output_tps": tps,
                            "ttft": getattr(p, f"ttft_p{q}"), "tpot": getattr(p, f"tpot_p{q}")}, met, "")


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
    played: dict[float, dict] = {}
    answers: dict[int, float] = {}

    def mean_answer(wl: Workload, context: int) -> float:  # drawn once a cell, not once a stage (a third of its time)
        if context not in answers:
            answers[context] = answer_tokens(wl, context)
        return answers[context]

    def stage(rate: float) -> Stage:
        st = predicted_stage(dep, load, rate, mean_answer)
        played[rate] = {"rate": rate, "ttft": st.summary["ttft"], "tpot": st.summary["tpot"]}
        return st

    best = sweep(stage, replace(search, start=load.sweep.start, max_stages=MODEL_STAGES)).best
    tps = best.summary["output_tps"] if best else 0.0
    rps = best.rate if best else 0.0
    band = interval.predicted_range(d.model.id, d.gpu.id, d.weights, "output_tok_s", rps) if rps else None
    return {"predicted_rps": rps, "predicted_output_tps": tps,
            "predicted_rps_low": band[0] if band else None, "predicted_rps_high": band[1] if band else None,
            "predicted_usd_per_m": usd_per_million(d.gpu.price_per_gpu_hour, dep.gpus, tps) if tps else None,
            "predicted_curve": latency_curve(d, list(played.values())), "percentile": load.slo.percentile}


def latency_curve(d: Deployment, played: list[dict]) -> list[dict]:
    """The model's TTFT and TPOT (at the SLO's percentile, seconds of the deployment's GPUs) at each rate its sweep
    played, each with its 80 % interval (bench/model/evidence/interval.py): the predicted curve the report draws
    beside the
    measured stages."""
    out = []
    for p in sorted(played, key=lambda x: x["rate"]):
        point = dict(p)
        for name, figure in (("ttft", "ttft_ms"), ("tpot", "tpot_ms")):
            value = p[name]
            r = interval.predicted_range(d.model.id, d.gpu.id, d.weights, figure, value) if value else None
            point[f"{name}_low"], point[f"{name}_high"] = r if r else (None, None)
        out.append(point)
    return out


def mem_fraction(dep: DeploymentSpec) -> float | None:
    """The static memory fraction the deployment runs with (its flag, its twin's, or SGLang's default for its GPU
    and tp, as the model computes it); None without a catalog model."""
    d, _ = modelled(dep)
    if d is None:
        return None
    return memory.capacity(d, with_ratios=False).mem_fraction_static
