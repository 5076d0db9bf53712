"""What a plan says beside its answer: what the intervals change about it, and FP8 KV's two effects (the pool it
doubles, the step time it costs or saves per attention backend that keeps its scales)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from bench.model.advice import fp8_kv
from bench.model.advice.option import Config, Option
from bench.model.fits import catalog, formats


def fp8_note(model: str, context: int | None, cfg: Config) -> str:
    """FP8 KV's two effects at this GPU and parallelism, per backend that keeps its scales (advice/fp8_kv.py)."""
    dep = replace(cfg, attention=None).deployment(model, context)
    parts = [e.words() for e in fp8_kv.effects(dep)]
    return f"FP8 KV on {cfg.gpu} x{cfg.tp} {cfg.parallelism()}: " + " | ".join(parts)


def interval_notes(rec: Option | None, simulated: list[Option], chosen: Option, target_rps: float) -> list[str]:
    """What the intervals change about a plan's answer: a configuration cheaper than the recommended one at the
    pessimistic end, and GPUs on hand that meet the target only at the optimistic end."""
    notes = []
    if rec is not None and (iv := rec.interval()):
        worst = {o.label: (o.interval() or {}).get("monthly_cost", (0, math.inf))[1] for o in simulated
                 if o.serves}
        other = min((k for k in worst if k != rec.label), key=worst.get, default=None)
        if other is not None and worst[other] < iv["monthly_cost"][1]:
            notes.append(f"At the pessimistic end of the 80 % intervals {other} costs less than the recommended "
                         f"one (${worst[other]:,.0f} against ${iv['monthly_cost'][1]:,.0f} a month): the "
                         "recommendation is the cheapest as predicted, not under every outcome the evidence allows")
    if chosen.serves and chosen.gpus_on_hand and (iv := chosen.interval()):
        instances = chosen.gpus_on_hand // chosen.tp
        low, high = (r * instances for r in iv["rate_rps"])
        if low < target_rps <= chosen.rate_on_hand_rps:
            notes.append(f"Your {chosen.gpus_on_hand} x {chosen.config.gpu} ({chosen.label}) meet "
                         f"{target_rps:g} req/s only towards the optimistic end of the 80 % interval "
                         f"({low:,.2f}-{high:,.2f} req/s): at its pessimistic end they need "
                         f"{iv['gpus_needed'][1]} GPUs")
    return notes


def format_notes(model_id: str, gpu_ids: Iterable[str]) -> list[str]:
    """Which expert formats were searched on each GPU, and why the others were not (never recommended)."""
    model, out = catalog.model(model_id), []
    for gpu_id in gpu_ids:
        gpu = catalog.gpu(gpu_id)
        skipped = [f for f in formats.names() if formats.why_not_served(model, gpu, f)]
        out.append(f"{gpu_id}: expert formats searched: {', '.join(formats.searched(model, gpu))}; not searched "
                   f"(`capbench formats --model {model_id} --gpu {gpu_id}` says why): {', '.join(skipped)}.")
    return out
