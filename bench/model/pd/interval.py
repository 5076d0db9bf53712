"""How far to trust a disaggregated answer: an interval on each role's rate, and what follows from it (instances,
GPUs, $ a month, $ per 1M, TTFT, TPOT).

The PD model (disagg.py) times steps with the same performance model the colocated figures use, so each role
starts from the colocated regime's 80 % band (interval.py): the decode instance's rate from the output tok/s band,
the prefill instance's from the TTFT band turned over (a prefill twice as fast halves the time to the first token).
Six published PD / wide-EP runs (validate_pd.py) are too few to calibrate a band of their own, so each role's band
is stretched to hold every published case of that phase (log published / predicted), then widened by
sqrt(1 + 2 / (n + 1)) for n such cases. This holds all of them by construction: it is not a calibrated 80 %, and
the words say so.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from bench.model.evidence import corpus, interval
from bench.model.pd import validate as validate_pd
from bench.model.pd.disagg import Answer

FIGURE = {"prefill": "input", "decode": "output"}


@cache
def residuals() -> dict[str, tuple[float, ...]]:
    """log(published / predicted) of each published PD case's throughput, by phase."""
    out: dict[str, list[float]] = {"prefill": [], "decode": []}
    for r in validate_pd.replay_all(corpus.load()):
        phase = r.case.pd.get("phase")
        out.setdefault(phase, []).extend(-math.log1p(e) for f, e in r.errors.items()
                                         if f.startswith(FIGURE.get(phase, "?")))
    return {k: tuple(v) for k, v in out.items()}


def _stretch(base: tuple[float, float] | None, res: tuple[float, ...]) -> tuple[float, float]:
    """Multipliers (low, high) on a role's rate: the colocated band and every PD case, widened for their number."""
    logs = [*res, *(math.log(x) for x in base or ())]
    if not logs:
        return 0.5, 2.0  # nothing at all: a factor of two either way, and the words say so
    w = math.sqrt(1 + 2 / (len(res) + 1))
    return math.exp(w * min(min(logs), 0.0)), math.exp(w * max(max(logs), 0.0))


def role_bands(a: Answer) -> dict[str, tuple[float, float]]:
    """Per role, multipliers (low, high) on its rate per instance."""
    s = a.shape
    res = residuals()
    reg = interval.regime(s.model, s.gpu, s.weights, a.batch_per_rank)
    tps, ttft = interval.band("output_tok_s", reg), interval.band("ttft_ms", reg)
    return {"prefill": _stretch((1 / ttft.high, 1 / ttft.low) if ttft else None, res.get("prefill", ())),
            "decode": _stretch((tps.low, tps.high) if tps else None, res.get("decode", ()))}


def _end(a: Answer, p: float, d: float) -> Answer:
    """The answer if each role ran at p and d times its predicted rate (its own instance and cost arithmetic)."""
    return replace(a, prefill_rps=a.prefill_rps * p, decode_rps=a.decode_rps * d)


def for_answer(a: Answer) -> dict | None:
    """The disaggregated answer's interval: each figure as (low, high), pessimistic and optimistic ends, the
    evidence in words. None when the answer serves nothing."""
    if not a.serves:
        return None
    b = role_bands(a)
    (p_lo, p_hi), (d_lo, d_hi) = b["prefill"], b["decode"]
    worst, best = _end(a, p_lo, d_lo), _end(a, p_hi, d_hi)
    res = residuals()
    n = {k: len(v) for k, v in res.items()}
    return {"method": "not calibrated: the colocated regime's 80 % band stretched to hold every published PD case",
            "cases": n, "prefill_rps": (a.prefill_rps * p_lo, a.prefill_rps * p_hi),
            "decode_rps": (a.decode_rps * d_lo, a.decode_rps * d_hi),
            "ratio": (best.ratio, worst.ratio), "gpus_needed": (best.gpus_needed, worst.gpus_needed),
            "monthly_cost": (best.monthly_cost, worst.monthly_cost),
            "usd_per_m_output": (best.usd_per_m_output, worst.usd_per_m_output),
            "ttft_s": (a.ttft_s / p_hi, a.ttft_s / p_lo), "tpot_s": (a.tpot_s / d_hi, a.tpot_s / d_lo),
            "evidence": (f"{n.get('prefill', 0)} published prefill and {n.get('decode', 0)} decode PD runs stand "
                         "behind these bounds, too few to calibrate an 80 % interval: each role's band is the "
                         "colocated one stretched to hold all of them; read it as the spread seen so far, and "
                         "measure before buying")}
