"""A configuration as a curve, not a point: output tokens/s per GPU against tokens/s per user over concurrency (the
trade-off InferenceX and AIPerf plot), each point with its 80 % band, the corpus's published points of the same
configuration beside it, and the Pareto front over every curve's points.

Each point is a closed-loop run of the simulator at one concurrency (a new request the moment one finishes, as
bench_serving --max-concurrency does) up to the instance's max running requests. Tokens/s per user is 1 / median
TPOT. The band: throughput per GPU by the interval of output tok/s, tokens/s per user by the interval of TPOT
(bench/model/evidence/interval.py), in the configuration's regime at that concurrency.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.model.evidence import interval
from bench.model.evidence.corpus import Case
from bench.model.fits.capacity import Deployment, capacity
from bench.model.serving.rate import closed_loop
from bench.model.serving.workload import Workload
from bench.model.step.calibration import Efficiency

CONCURRENCY = (1, 4, 16, 64, 256)
REQUESTS_PER_SLOT = 3  # requests per concurrency slot (at least 24): enough for a median, short enough for a plan


@dataclass(frozen=True)
class CurvePoint:
    config: str
    concurrency: int
    tps_per_gpu: float
    tps_per_user: float
    tps_per_gpu_low: float
    tps_per_gpu_high: float
    tps_per_user_low: float
    tps_per_user_high: float
    ttft_s: float
    pareto: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def curve(label: str, dep: Deployment, wl: Workload, eff: Efficiency | None = None,
          levels: tuple[int, ...] = CONCURRENCY) -> list[CurvePoint]:
    """The configuration's points at each concurrency it can run (up to its max running requests)."""
    out = []
    for c, n in runs(dep, levels):
        p = closed_loop(dep, wl, c, n, eff)
        if p.output_tok_s <= 0 or not p.tpot_p50 > 0:
            continue
        per_gpu, per_user = p.output_tok_s / dep.tp, 1.0 / p.tpot_p50
        reg = interval.regime(dep.model.id, dep.gpu.id, dep.weights, c)
        t, tpot = interval.band("output_tok_s", reg), interval.band("tpot_ms", reg)
        gl, gh = t.of(per_gpu) if t else (per_gpu, per_gpu)
        ul, uh = (per_user / tpot.high, per_user / tpot.low) if tpot else (per_user, per_user)
        out.append(CurvePoint(label, c, per_gpu, per_user, gl, gh, ul, uh, p.ttft_p50))
    return out


def runs(dep: Deployment, levels: tuple[int, ...] = CONCURRENCY) -> list[tuple[int, int]]:
    """(concurrency, requests) of each closed-loop run a curve is drawn from: up to the max running requests."""
    cap = capacity(dep, with_ratios=False)
    if not cap.fits:
        return []
    return [(c, max(REQUESTS_PER_SLOT * c, 24)) for c in levels if c <= cap.max_running_requests]


def front(points: list[CurvePoint]) -> list[CurvePoint]:
    """The points no other point beats on both throughput per GPU and tokens/s per user, marked pareto."""
    def beaten(a: CurvePoint) -> bool:
        return any(b.tps_per_gpu >= a.tps_per_gpu and b.tps_per_user >= a.tps_per_user and
                   (b.tps_per_gpu, b.tps_per_user) != (a.tps_per_gpu, a.tps_per_user) for b in points)

    return [CurvePoint(**{**p.to_dict(), "pareto": not beaten(p)}) for p in points]


def published(cases: tuple[Case, ...], dep: Deployment) -> list[dict]:
    """The corpus's published points of this configuration (model, GPU, tp, DP attention, EP, weights, KV dtype;
    no MTP; SGLang 0.5.x): throughput per GPU and 1 / TPOT, with the case and its concurrency."""
    out = []
    for c in cases:
        p, w = c.published, c.workload
        if (c.kind != "throughput" or p is None or w is None or not p.output_tok_s or not p.tpot_ms or c.mtp
                or c.engine_era != "0.5"
                or (c.model, c.gpu, c.tp, c.dp, c.ep, c.weights, c.kv_dtype) !=
                (dep.model.id, dep.gpu.id, dep.tp, dep.dp, dep.ep, dep.weights, dep.kv_dtype)):
            continue
        out.append({"case": c.key, "concurrency": w.max_concurrency, "tps_per_gpu": p.output_tok_s / c.gpus,
                    "tps_per_user": 1e3 / p.tpot_ms, "sglang_version": c.sglang_version, "url": c.source.url})
    return out
