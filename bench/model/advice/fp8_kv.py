"""What FP8 KV does to a deployment, as the two things it is: more sequences in the KV pool, and a step-time cost or
gain on the attention backend that reads it (per backend that keeps calibrated FP8 scales, each priced with its own
kernel table, or the roofline where it has none, said). The capacity matrix, the planner and the reports quote this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.model.fits import backend
from bench.model.fits.capacity import Deployment, capacity
from bench.model.step.perfmodel import PerfModel


@dataclass(frozen=True)
class Fp8Effect:
    backend: str
    pool_ratio: float  # KV pool tokens, FP8 / BF16
    step_ratio: float  # a decode step at the same batch and context, FP8 on this backend / BF16 on the default
    throughput_ratio: float  # decode tok/s at each one's largest batch at the context (capped at max running)
    batch: int
    context: int
    priced_by: str  # "kernel tables" or the roofline sentence

    def words(self) -> str:
        step = self.step_ratio - 1
        return (f"FP8 KV on {self.backend}: {self.pool_ratio:.2f}x the KV pool; a decode step of {self.batch} x "
                f"{self.context:,} tokens {'+' if step >= 0 else ''}{step:.0%} against BF16; at the largest batch "
                f"each holds, {self.throughput_ratio:.2f}x the decode tok/s ({self.priced_by})")


def _largest_batch(dep: Deployment, context: int) -> int:
    c = capacity(dep, with_ratios=False)
    return max(1, min(c.max_running_requests, c.kv_pool_tokens_total // max(context, 1)))


def effects(dep: Deployment, context: int = 8192, batch: int | None = None) -> list[Fp8Effect]:
    """FP8 KV against BF16 KV (on SGLang's default backend) for this deployment, per backend that keeps scales."""
    bf16 = replace(dep, kv_dtype="bf16", attention=None, page_size=None)
    pm_bf16 = PerfModel(bf16)
    b16_batch = _largest_batch(bf16, context)
    batch = batch or min(b16_batch, 64)
    base_step = pm_bf16.step_time(batch, batch * context)
    base_tps = pm_bf16.decode_throughput(b16_batch, context)
    base_pool = capacity(bf16, with_ratios=False).kv_pool_tokens_total
    out = []
    for name in backend.candidates(dep.model, dep.gpu, "fp8_e4m3"):
        fp8 = replace(dep, kv_dtype="fp8_e4m3", attention=name, page_size=None)
        pm = PerfModel(fp8)
        step = pm.step_time(batch, batch * context)
        top = _largest_batch(fp8, context)
        out.append(Fp8Effect(name, capacity(fp8, with_ratios=False).kv_pool_tokens_total / max(base_pool, 1),
                             step / base_step, pm.decode_throughput(top, context) / base_tps, batch, context,
                             pm.model_said))
    return out
