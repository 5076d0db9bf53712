"""Expert formats side by side for one model on one GPU (`capbench formats`, the capacity report's section and the
Planner's): per format its memory per GPU, KV pool and sequences at the model's context (SGLang's arithmetic,
capacity.py), the predicted output tokens/s per GPU and $ per 1M output tokens at the highest rate within an SLO,
the SGLang kernel that runs it, where the checkpoint comes from, and the published accuracy evidence.

Pricing goes through price() alone: the performance model behind the simulator (perfmodel.py via
rate.search_rate), with the kernel tables where they hold the format and GPU, else the roofline; each row says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.model.advice.launch import expert_ep
from bench.model.fits import catalog, formats
from bench.model.fits.capacity import Deployment, capacity
from bench.model.serving.rate import search_rate
from bench.model.serving.slo import Slo
from bench.model.serving.workload import Workload, load_workload
from bench.model.step.perfmodel import PerfModel, usd_per_million


@dataclass(frozen=True)
class Priced:
    output_tps_per_gpu: float
    usd_per_m_output: float | None
    rate_rps: float
    limited_by: str
    method: str  # which model priced it: the kernel tables (and what they lacked) or the roofline (perfmodel)


def price(dep: Deployment, wl: Workload, slo: Slo, price_per_gpu_hour: float) -> Priced:
    """The one pricing call of the formats table: output tokens/s per GPU and $ per 1M output tokens at the highest
    rate within the SLO."""
    p = search_rate(dep, wl, slo)
    tps = p.output_tps if p.rate_rps > 0 else 0.0
    return Priced(tps / dep.tp, usd_per_million(price_per_gpu_hour, dep.tp, tps), p.rate_rps, p.limited_by,
                  PerfModel(dep).model_said)


@dataclass
class FormatRow:
    format: str
    name: str
    weights: str  # the --weights it is priced as
    bytes_per_weight: float
    kernel: str
    kernel_file: str | None
    served: bool  # the planner searches it: a real kernel, loaded for this architecture, obtainable
    status: str  # searched | not served | no kernel | not loaded | not obtainable
    why_not: str | None
    checkpoint: str
    checkpoint_short: str
    obtainable: bool
    accuracy: str
    tp: int
    ep: int
    fits: bool
    weight_gb_per_gpu: float
    kv_pool_tokens: int
    seqs_at_context: int
    context: int
    priced: Priced | None

    def to_dict(self) -> dict:
        return asdict(self)


def _kernel_text(fmt: str, arch: str | None) -> tuple[str, str | None]:
    k = formats.kernel(fmt, arch)
    if k is None:
        return f"none on {arch or 'this GPU'}", None
    return k.kernel, f"sglang/srt/{k.file}"


def rows(model_id: str, gpu_id: str, tp: int = 8, kv_dtype: str = "fp8_e4m3", workload: str | Workload = "chat",
         slo: Slo | None = None, context: int | None = None,
         price_per_gpu_hour: float | None = None) -> list[FormatRow]:
    """One row per expert format of data/expert_formats.yaml. Formats the GPU runs and the model loads are priced
    even when not obtainable (what they would buy), and marked so; the planner never recommends those."""
    model, gpu = catalog.model(model_id), catalog.gpu(gpu_id)
    slo = slo or Slo(ttft_s=2.0, tpot_s=0.05)
    hourly = gpu.price_per_gpu_hour if price_per_gpu_hour is None else price_per_gpu_hour
    wl = workload if isinstance(workload, Workload) else load_workload(workload)
    out = []
    for fmt in formats.names():
        f, src = formats.get(fmt), formats.obtain(model, fmt)
        weights = src.weights if src else fmt
        ep = expert_ep(model_id, tp, weights)
        dep = Deployment(model, gpu, tp, 1, kv_dtype, weights, context, ep=ep)
        cap = capacity(dep, with_ratios=False)
        status, why = formats.verdict(model, gpu, fmt)
        k = formats.kernel(fmt, gpu.arch)
        runs = k is not None and k.served and formats.loads(model, fmt)
        kernel, file = _kernel_text(fmt, gpu.arch)
        out.append(FormatRow(
            format=fmt, name=f.name, weights=weights, bytes_per_weight=f.bytes_per_weight, kernel=kernel,
            kernel_file=file, served=why is None, status=status, why_not=why,
            checkpoint=src.describe() if src else "not obtainable", checkpoint_short=src.short() if src else "-",
            obtainable=src is not None, accuracy=formats.accuracy(model_id, fmt), tp=tp, ep=ep, fits=cap.fits,
            weight_gb_per_gpu=cap.weight_bytes_per_gpu / 1e9, kv_pool_tokens=cap.kv_pool_tokens_total,
            seqs_at_context=cap.max_concurrent_sequences_at_context, context=cap.context,
            priced=price(dep, wl, slo, hourly) if runs and cap.fits else None))
    return out


def describe(model_id: str, gpu_id: str, tp: int, kv_dtype: str, workload: str, slo: Slo) -> str:
    """The conditions of the table, with the pricing method named."""
    gpu = catalog.gpu(gpu_id)
    return (f"{model_id} on {gpu_id} ({gpu.arch}) x{tp}, {kv_dtype} KV, workload {workload}, SLO {slo.describe()}; "
            f"tok/s and $ per 1M: the performance model (kernel tables or roofline: 'Priced by' below), "
            f"${gpu.price_per_gpu_hour:.2f} per GPU-hour")
