"""The search over prefill/decode shapes (disagg.py) for a target load, and the colocated instance it is weighed
against: the same kernels time-sharing both phases, every decode step stretched by 1 / (1 - prefill share)."""

from __future__ import annotations

from dataclasses import replace

from bench.model.fits import catalog
from bench.model.pd.disagg import (
    Answer,
    Lengths,
    Shape,
    batch_candidates,
    chunk,
    decode_pool,
    decode_step_s,
    evaluate,
    prefill_step_s,
)
from bench.model.serving.slo import Slo
from bench.model.step.calibration import Efficiency


def colocated_rps(shape: Shape, ln: Lengths, slo: Slo, eff: Efficiency | None = None) -> tuple[float, float]:
    """(requests/s, the prefill share of each second) of ONE instance of the decode size serving both phases by
    time-sharing, with the same kernels as PD: every decode step stretched by 1 / (1 - prefill share)."""
    dec = shape.deployment("decode")
    same = replace(shape, prefill_gpus=shape.decode_gpus, prefill_dp_attention=True)
    size = chunk(same)
    c = prefill_step_s(same, size, ln, eff) * ln.new / size / dec.dp  # instance-seconds of prefill per request
    pool = decode_pool(shape)
    cap = min(int(pool.tokens_per_rank // (ln.prompt + ln.output)), pool.max_running_per_rank) if pool.fits else 0
    best, share = 0.0, 0.0
    ctx = ln.prompt + ln.output / 2
    for b in batch_candidates(cap):
        step = decode_step_s(shape, b, ctx, eff)
        x = b * dec.dp / (ln.output * step)  # requests/s if decode had the GPUs to itself
        r = x / (1 + x * c)
        tpot = step / (1 - r * c)
        if (slo.tpot_s is None or tpot <= slo.tpot_s) and r > best:
            best, share = r, r * c
    return best, share


def search(model: str, gpus: list[str], ln: Lengths, slo: Slo, target_rps: float, max_nodes: int = 16,
           kv_dtypes: tuple[str, ...] = ("bf16", "fp8_e4m3"), price_of=None, context: int | None = None,
           transfer: bool = True, in_flight: int | None = None) -> list[Answer]:
    """Every shape: prefill and decode instances of 1, 2, 4, ... nodes (up to max_nodes each), both KV dtypes,
    native weights, EPLB on; cheapest first (those that serve), then the rejected. in_flight: a client's cap per
    decode instance (disagg.evaluate)."""
    out = []
    for gpu_id in gpus:
        per = catalog.gpu(gpu_id).gpus_per_node
        sizes = [per * n for n in (1, 2, 4, 8, 16, 32) if n <= max_nodes]
        price = price_of(gpu_id) if price_of else None
        for kv in kv_dtypes:
            for p in sizes[:3]:  # prefill past four nodes only adds all-to-all cost
                for d in sizes:
                    for dpa in (True, False):
                        shape = Shape(model, gpu_id, p, d, kv, context=context, prefill_dp_attention=dpa)
                        out.append(evaluate(shape, ln, slo, target_rps, price, transfer, in_flight=in_flight))
    return sorted(out, key=lambda a: (not a.serves, a.monthly_cost or 0.0, a.gpus_per_rps))
