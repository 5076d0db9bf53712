"""One deployment option of a plan: a GPU, its parallelism (tp, DP attention, EP), KV dtype and expert weights,
with what it holds (capacity), what it serves within the SLO (a converged simulated rate), and what it costs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.model.advice import launch
from bench.model.evidence import interval
from bench.model.fits import catalog, formats
from bench.model.fits.capacity import Capacity, Deployment, weight_formats
from bench.model.serving.rate import Prediction
from bench.model.step.perfmodel import usd_per_million

HOURS_PER_MONTH = interval.HOURS_PER_MONTH


@dataclass(frozen=True)
class Config:
    gpu: str
    tp: int
    dp: int = 1
    ep: int = 1
    kv_dtype: str = "bf16"
    weights: str = "native"
    attention: str | None = None  # --attention-backend; None: the one the launch line names by default

    def deployment(self, model: str, context: int | None = None) -> Deployment:
        return Deployment(catalog.model(model), catalog.gpu(self.gpu), self.tp, self.dp, self.kv_dtype, self.weights,
                          context, ep=self.ep, attention=self.attention)

    def parallelism(self) -> str:
        return f"tp{self.tp}" + (f" dp{self.dp}" if self.dp > 1 else "") + (f" ep{self.ep}" if self.ep > 1 else "")


@dataclass
class Option:
    config: Config
    model: str
    capacity: Capacity
    price: float  # $ per GPU-hour
    target_rate_rps: float
    prediction: Prediction | None = None  # simulated (converged); None: not simulated
    saturation_tps: float | None = None  # output tokens/s of a burst: the screen's optimistic figure
    rejected_because: str | None = None
    chosen: bool = False
    recommended: bool = False
    pareto: bool = False  # on the front of output tokens/s per GPU vs tokens/s per user
    pareto_cost: bool = False  # on the front of $ per 1M output tokens vs E2E latency at the SLO's percentile
    gpus_on_hand: int | None = None

    @property
    def kv_dtype(self) -> str:
        return self.config.kv_dtype

    @property
    def weights(self) -> str:
        return self.config.weights

    @property
    def tp(self) -> int:
        return self.config.tp

    @property
    def label(self) -> str:
        """e.g. 'h200 x8 tp8, int4-g32 experts (native), fp8_e4m3 KV'."""
        experts = weight_formats(catalog.model(self.model), self.weights)[0]
        return (f"{self.config.gpu} x{self.config.tp} {self.config.parallelism()}, {experts} experts"
                f"{' (native)' if self.weights == 'native' else ''}, {self.kv_dtype} KV{self._backend()}")

    def _backend(self) -> str:
        """', on fa3' where the option names a backend other than the launch line's default."""
        return f", on {self.config.attention}" if self.config.attention else ""

    @property
    def short_label(self) -> str:
        """The KV dtype and expert weights only (for comparisons at one parallelism)."""
        experts = weight_formats(catalog.model(self.model), self.weights)[0]
        native = " (native)" if self.weights == "native" else ""
        return f"{experts} experts{native}, {self.kv_dtype} KV{self._backend()}"

    @property
    def checkpoint(self) -> str:
        """Where its checkpoint comes from: the vendor's, a published one (named), capbench's conversion, or
        'not obtainable'."""
        src = formats.source_of(catalog.model(self.model), self.weights)
        return src.describe() if src else "not obtainable"

    @property
    def simulated(self) -> bool:
        return self.prediction is not None

    @property
    def serves(self) -> bool:
        return self.prediction is not None and self.prediction.rate_rps > 0

    @property
    def output_tps_per_gpu(self) -> float | None:
        return self.prediction.output_tps / self.tp if self.serves else None

    @property
    def usd_per_m_output(self) -> float | None:
        """$ per 1M output tokens at the highest rate within the SLO: the one definition, everywhere."""
        return usd_per_million(self.price, self.tp, self.prediction.output_tps) if self.serves else None

    @property
    def instances_needed(self) -> int | None:
        if not self.serves:
            return None
        return max(1, math.ceil(self.target_rate_rps / self.prediction.rate_rps - 1e-9))

    @property
    def gpus_needed(self) -> int | None:
        n = self.instances_needed
        return None if n is None else n * self.tp

    @property
    def monthly_cost(self) -> float | None:
        g = self.gpus_needed
        return None if g is None else g * self.price * HOURS_PER_MONTH

    @property
    def rate_on_hand_rps(self) -> float | None:
        if self.prediction is None or not self.gpus_on_hand:
            return None
        return self.prediction.rate_rps * (self.gpus_on_hand // self.tp)

    def commands(self) -> tuple[str | None, list[str]]:
        """(one-node command or None, one command per node) with every flag the price rests on: parallelism, KV
        dtype, the KV pool's memory fraction and page size, context."""
        c, cfg = self.capacity, self.config
        named = {"attention": cfg.attention} if cfg.attention else {}
        return launch.commands(self.model, cfg.gpu, cfg.tp, cfg.kv_dtype, cfg.weights, c.context, dp=cfg.dp,
                               ep=cfg.ep, mem_fraction=c.mem_fraction_static, page_size=c.page_size, **named)

    def attention_backend(self) -> str | None:
        """The attention backend this option is priced and launched with."""
        return self.config.deployment(self.model, self.capacity.context).attention

    def launch(self) -> list[str]:
        """The command(s) that deploy this configuration as priced: one line on one node, else one per node."""
        single, multi = self.commands()
        return [single] if single else multi

    def interval(self) -> dict | None:
        """Each predicted figure's 80 % interval from the corpus's out-of-sample errors
        (bench/model/evidence/interval.py)."""
        return _interval(self)

    def to_row(self) -> dict:
        c, p, cfg = self.capacity, self.prediction, self.config
        return {
            "config": self.label, "short": self.short_label, "gpu": cfg.gpu, "tp": cfg.tp, "dp": cfg.dp,
            "ep": cfg.ep, "gpus_per_instance": cfg.tp, "nodes": c.nodes, "weights": cfg.weights,
            "kv_dtype": cfg.kv_dtype, "attention": self.attention_backend(), "chosen": self.chosen,
            "recommended": self.recommended, "pareto": self.pareto,
            "pareto_cost": self.pareto_cost, "fits": c.fits, "rejected_because": self.rejected_because,
            "simulated": self.simulated, "weights_gb_per_gpu": c.weight_bytes_per_gpu / 1e9,
            "kv_pool_tokens": c.kv_pool_tokens_total,
            "concurrent_seqs_at_context": c.max_concurrent_sequences_at_context,
            "max_running_requests": c.max_running_requests, "batch": p.batch if p else None,
            "rate_rps": p.rate_rps if p else None, "output_tps": p.output_tps if p else None,
            "output_tps_per_gpu": self.output_tps_per_gpu, "tps_per_user": p.tps_per_user if self.serves else None,
            "ttft_s": p.ttft_s if p else None, "tpot_s": p.tpot_s if p else None, "e2e_s": p.e2e_s if p else None,
            "limited_by": p.limited_by if p else None, "converged": p.converged if p else None,
            "usd_per_m_output": self.usd_per_m_output, "instances": self.instances_needed,
            "gpus_total": self.gpus_needed, "gpus_needed": self.gpus_needed, "monthly_cost": self.monthly_cost,
            "price_per_gpu_hour": self.price, "rate_on_hand_rps": self.rate_on_hand_rps,
            "saturation_tps": self.saturation_tps, "launch": self.launch() if self.simulated else None,
            "checkpoint": self.checkpoint,
            "interval": self.interval(),
        }

def _interval(o: Option) -> dict | None:
    """Every predicted figure of a plan's option as (low, high) at 80 %, the regime, its cases and, where the
    evidence is thin, the sentence that says so. None when the option serves nothing."""
    if not o.serves:
        return None
    p, cfg = o.prediction, o.config
    reg = interval.regime(o.model, cfg.gpu, cfg.weights, p.batch)
    tps, ttft, tpot = (interval.band(f, reg) for f in interval.FIGURES)
    if tps is None:
        return None
    rate = tps.of(p.rate_rps)
    instances = tuple(max(1, math.ceil(o.target_rate_rps / r - 1e-9)) for r in (rate[1], rate[0]))
    gpus = tuple(n * cfg.tp for n in instances)
    usd = o.usd_per_m_output
    return {"level": interval.LEVEL, "regime": reg.label(), "cases": tps.cases, "evidence": interval.evidence(reg),
            "rate_rps": rate, "output_tps": tps.of(p.output_tps),
            "ttft_s": ttft.of(p.ttft_s) if ttft else None, "tpot_s": tpot.of(p.tpot_s) if tpot else None,
            "usd_per_m_output": (usd / tps.high, usd / tps.low), "instances": instances, "gpus_needed": gpus,
            "monthly_cost": tuple(g * o.price * HOURS_PER_MONTH for g in gpus)}


def obtainable(model_id: str, cfg: Config) -> bool:
    """Whether a configuration may be recommended: its GPU runs the expert format with a real kernel, and a
    checkpoint in it is shipped or capbench makes it."""
    model, gpu = catalog.model(model_id), catalog.gpu(cfg.gpu)
    if cfg.weights == "native":
        return True
    fmt = formats.weights_format(model, cfg.weights)
    return formats.why_not_served(model, gpu, fmt) is None and formats.source_of(model, cfg.weights) is not None


def unobtainable(model_id: str, cfg: Config) -> str:
    model, gpu = catalog.model(model_id), catalog.gpu(cfg.gpu)
    fmt = formats.weights_format(model, cfg.weights)
    return formats.why_not_served(model, gpu, fmt) or f"no checkpoint serves --weights {cfg.weights}"
