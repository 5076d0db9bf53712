"""Fit the performance model's factors to the published corpus, and say how well it predicts what it did not see.

The fitted cases are those of the engine capbench models (SGLang 0.5.x) that can be replayed and are not marked
as outliers in data/calibration/outliers.yaml (with the reason). The loss is the mean Huber loss of
log(predicted / published) over output throughput, TPOT and TTFT. The fit is scipy's bounded robust least squares
(trust-region reflective, Huber loss) in log space over the FITTED factors, each a multiplier of its prior (so a
GPU-specific prior keeps its ratio to the others), from the last fit's scales.

Accuracy is quoted out of sample only: leave-one-source-out fits the factors on the other organisations' cases
and predicts the left-out organisation's cases with them; the errors of all those predictions are the figures
the README and the reports quote.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from bench.errors import BadInput
from bench.model.evidence.corpus import Case
from bench.model.evidence.validate import FIGURES, Replay, error_summary, replay
from bench.model.step.calibration import CORPUS_CALIBRATION, DEFAULT_CALIBRATION, Efficiency, _layers, _read

# Fitted: the factors a step priced from the kernel tables reads (perfmodel.parts(): the tables' kernel_scale, the
# fixed cost of the kernels no table times, launches outside CUDA graphs, the scheduler's step, the CPU per request
# and per streamed token; the dense GEMMs' roofline: hbm_eff and fp8_eff). The roofline's other factors (bf16_eff,
# gemm_m_half/n_half, overlap, allreduce_latency_us, prefill_attn_eff) only price GPUs without tables and
# operators no table covers: they keep the scales of the last fit that moved them (the roofline's, in corpus.json).
# Kept at their sourced priors: mtp_accept and dp_gather_latency_us (few cases, on other GPUs and engines, pull
# them to their bounds), int8, int4_dequant and ep_skew (no case).
FITTED = ("kernel_scale", "kernel_us", "launch_us", "step_overhead_ms", "request_overhead_ms", "stream_token_us",
          "hbm_eff", "fp8_eff")
# Fitted per GPU as well, on that GPU's cases only, for each GPU without kernel tables (MI300X, A100): its
# roofline_scale ("roofline_scale@mi300x"), the whole roofline GPU time of that GPU, as kernel_scale is the tables'.
# The shared factors are fitted mostly on Hopper and Blackwell, which the tables price; MI300X's runs came out
# 1.3-2x too fast and A100's too slow. A fold whose training cases hold none of that GPU's cases keeps 1: no evidence.
# (Tried instead, 2026-12-07: MI300X's kernel_us alone, and kernel_us for both: worse out of sample, docs/planning.md.)
PER_GPU = ("roofline_scale",)
PER_GPU_RANGE = (0.25, 4.0)  # a GPU's own multiplier, on top of the shared scale
BOUNDS = {"hbm_eff": (0.3, 0.95), "bf16_eff": (0.1, 0.9), "fp8_eff": (0.1, 0.9), "gemm_m_half": (1, 512),
          "gemm_n_half": (1, 4096), "dp_gather_latency_us": (1, 300),
          "overlap": (0.0, 1.0), "kernel_us": (0.5, 30), "launch_us": (1, 50), "allreduce_latency_us": (1, 100),
          "request_overhead_ms": (1, 500), "prefill_attn_eff": (0.05, 0.75), "stream_token_us": (1, 2000),
          "mtp_accept": (0.2, 0.95), "kernel_scale": (0.2, 5.0), "step_overhead_ms": (0.01, 20),
          "roofline_scale": PER_GPU_RANGE}
ROUNDS = 12  # least_squares' trial steps (function evaluations, not counting the Jacobian's len(FITTED) each)
STEP = 0.3  # the first trust region: a move of about 30 % of the scales (in log space)
HUBER = 0.4  # log error beyond which a case's loss grows linearly (a 1.5x miss), not quadratically
DIFF_STEP = 0.05  # the Jacobian's step in log scale: 5 %, above the replay's scheduling noise
WEIGHTS = {"output_tok_s": 1.0, "tpot_ms": 1.0, "ttft_ms": 0.5}
OUTLIERS = DEFAULT_CALIBRATION.parent / "outliers.yaml"
VALIDATION = DEFAULT_CALIBRATION.parent / "validation.json"


def outliers() -> dict[str, str]:
    """Cases left out of the fit and the goal, by key (source id/case id), with the reason."""
    raw = yaml.safe_load(OUTLIERS.read_text()) if OUTLIERS.exists() else {}
    return {str(k): str(v) for k, v in (raw or {}).items()}


def in_goal(case: Case) -> str | None:
    """None if the case counts for the fit and the goal, else why not."""
    why = outliers().get(case.key)
    if why:
        return f"outlier: {why}"
    if case.engine_era != "0.5":
        return f"SGLang {case.sglang_version}: capbench models 0.5.x"
    return None


def priors(gpu: str) -> Efficiency:
    eff = Efficiency()
    for layer in _layers(_read(DEFAULT_CALIBRATION), gpu):
        eff = eff.updated(layer)
    return eff


def per_gpu(cases: list[Case]) -> tuple[str, ...]:
    """The per-GPU factors `cases` can fit: PER_GPU's, for each GPU of theirs that no kernel table covers."""
    from bench.model.step import kernels

    gpus = sorted({c.gpu for c in cases if not kernels.versions(c.gpu, "attention")})
    return tuple(f"{name}@{g}" for name in PER_GPU for g in gpus)


def scaled(gpu: str, scale: dict[str, float]) -> Efficiency:
    """A GPU's priors with each fitted factor multiplied by its scale (clipped to the factor's bounds); a scale named
    "factor@gpu" multiplies that GPU's factor once more."""
    eff = priors(gpu)
    product: dict[str, float] = {}
    for key, s in scale.items():
        name, _, only = key.partition("@")
        if not only or only == gpu:
            product[name] = product.get(name, 1.0) * s
    values = {}
    for name, s in product.items():
        lo, hi = BOUNDS[name]
        values[name] = min(hi, max(lo, getattr(eff, name) * s))
    return replace(eff, **values)


def scale_range(key: str) -> tuple[float, float]:
    """The scales of a factor that move it on some GPU: beyond them `scaled` clips every GPU's value to its bounds
    (a flat loss, where least_squares would not move). A "factor@gpu" scale, on top of the shared one: PER_GPU_RANGE."""
    if "@" in key:
        return PER_GPU_RANGE
    lo, hi = BOUNDS[key]
    values = [getattr(priors(g), key) for g in [*(_read(DEFAULT_CALIBRATION).get("gpus") or {}), "__none__"]]
    return min(lo / v for v in values), max(hi / v for v in values)


def _huber(x: float, d: float = HUBER) -> float:
    return x * x / 2 if abs(x) <= d else d * (abs(x) - d / 2)


def loss(replays: list[Replay]) -> float:
    terms = [WEIGHTS[f] * _huber(math.log1p(r.errors[f])) for r in replays for f in FIGURES if f in r.errors]
    return sum(terms) / max(len(terms), 1)


def residuals(replays: list[Replay]) -> np.ndarray:
    """sqrt(weight) * log(predicted / published) per case and figure, 0 where a figure is not compared (a fixed
    length, as least_squares needs): what `fit` minimises the Huber loss of, as `loss` scores it."""
    return np.array([math.sqrt(WEIGHTS[f]) * math.log1p(r.errors[f]) if f in r.errors else 0.0
                     for r in replays for f in FIGURES])


def _replay_one(args: tuple[Case, dict[str, float]]) -> Replay:
    case, scale = args
    return replay(case, scaled(case.gpu, scale))


class Replayer:
    """Replays cases under a scale, in worker processes (the corpus takes ~4 s on one core)."""

    def __init__(self, workers: int = 2) -> None:
        self.pool = ProcessPoolExecutor(workers) if workers > 1 else None

    def __call__(self, cases: list[Case], scale: dict[str, float]) -> list[Replay]:
        jobs = [(c, scale) for c in cases]
        if self.pool is None:
            return [_replay_one(j) for j in jobs]
        return list(self.pool.map(_replay_one, jobs, chunksize=4))

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()


def fit(cases: list[Case], replayer: Replayer, progress: Callable[[str], None] = lambda _: None,
        rounds: int = ROUNDS, factors: tuple[str, ...] | None = None, base: dict[str, float] | None = None,
        ) -> tuple[dict[str, float], float]:
    """Scales of `factors` (None: FITTED and the cases' per_gpu ones) that minimise the loss over `cases` (the other
    factors kept at `base`'s scales, else their priors): bounded robust least squares (scipy's trust-region
    reflective, Huber loss) in log space, from `base`'s scales; `rounds` caps its trial steps (each accepted one
    replays the cases len(factors) more times for the next Jacobian); it stops when a step gains under 0.1 % of the
    loss. Returns (scale, loss)."""
    base = dict(base or {})
    factors = (*FITTED, *per_gpu(cases)) if factors is None else factors
    start = np.array([base.get(n, 1.0) for n in factors])
    ranges = [scale_range(n) for n in factors]
    # x: log of each scale over its start, so the first trust region (norm 1 in units of x_scale) is a STEP move
    lo = np.log([r[0] for r in ranges]) - np.log(start)
    hi = np.log([r[1] for r in ranges]) - np.log(start)
    x0 = np.clip(np.zeros(len(factors)), lo + 1e-9, hi - 1e-9)
    calls = [0]

    def scale_of(x: np.ndarray) -> dict[str, float]:
        return {**base, **{n: float(s0 * math.exp(v)) for n, s0, v in zip(factors, start, x, strict=True)}}

    def fun(x: np.ndarray) -> np.ndarray:
        calls[0] += 1
        out = residuals(replayer(cases, scale_of(x)))
        progress(f"replay {calls[0]}: loss {float(np.mean([_huber(v) for v in out])):.4f}")
        return out

    from scipy.optimize import least_squares  # here: every process that imports bench.model (a twin) starts faster

    r = least_squares(fun, x0, bounds=(lo, hi), loss="huber", f_scale=HUBER, diff_step=DIFF_STEP,
                      x_scale=STEP, max_nfev=rounds, ftol=1e-3, xtol=1e-3)
    scale = scale_of(r.x)
    return scale, loss(replayer(cases, scale))


def leave_one_source_out(cases: list[Case], replayer: Replayer, progress: Callable[[str], None] = lambda _: None,
                         rounds: int = ROUNDS, factors: tuple[str, ...] | None = None,
                         base_by_org: dict[str, dict[str, float]] | None = None,
                         ) -> tuple[list[Replay], dict[str, dict[str, float]]]:
    """Each organisation's cases predicted with factors fitted on the others' cases; a fold starts from (and keeps
    the factors not fitted at) base_by_org's scales for that organisation, fitted without it too."""
    orgs = sorted({c.source.org for c in cases})
    out, scales = [], {}
    for org in orgs:
        train = [c for c in cases if c.source.org != org]
        test = [c for c in cases if c.source.org == org]
        if not train:
            continue
        scale, _ = fit(train, replayer, lambda msg, org=org: progress(f"without {org}: {msg}"), rounds, factors,
                       (base_by_org or {}).get(org))
        scales[org] = scale
        out += replayer(test, scale)
    return out, scales


def write(scale: dict[str, float], in_sample: list[Replay], out_of_sample: list[Replay],
          scales_by_org: dict[str, dict[str, float]], excluded: list[Replay], path: Path = CORPUS_CALIBRATION) -> None:
    """corpus.json (factors per GPU, as load_efficiency reads them) and validation.json (per-case errors)."""
    gpus = sorted({c.case.gpu for c in in_sample + excluded} | set(_read(DEFAULT_CALIBRATION).get("gpus") or {}))
    names = sorted({k.partition("@")[0] for k in scale})
    fitted = {"method": "capbench validate --fit: bounded robust least squares on the published corpus "
                        "(data/measurements)",
              "fitted_at": time.strftime("%Y-%m-%d"), "scale": scale,
              "default": {k: getattr(scaled("__none__", scale), k) for k in names},
              "gpus": {g: {k: getattr(scaled(g, scale), k) for k in names} for g in gpus}}
    path.write_text(json.dumps(fitted, indent=2) + "\n")
    write_validation(in_sample, out_of_sample, scales_by_org, excluded)


def last_scales(orgs: set[str]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The last fit's scales (corpus.json) and, for each of `orgs`, the scales fitted without it (validation.json;
    the shipped ones for an organisation added since, which none of its fits saw). ({}, {}) before any fit."""
    stored = stored_validation()
    if not stored or not CORPUS_CALIBRATION.exists():
        return {}, {}
    scale = json.loads(CORPUS_CALIBRATION.read_text())["scale"]
    by_org = dict(stored["out_of_sample"]["scales_by_left_out_org"])
    return scale, {**by_org, **{o: scale for o in orgs - set(by_org)}}


def rescore(goal: list[Case], excluded: list[Case], replayer: Replayer) -> None:
    """validation.json again, for a change to the model that adds no fitted factor: every case replayed by today's
    model with the last fit's scales (a left-out organisation's cases with the scales fitted without it), the
    scales themselves not fitted again (the fit takes about an hour on two cores). An organisation added since the
    last fit was in none of its fits (each fit left out one organisation of its day), so its cases are out of
    sample with the shipped scales, and count there."""
    scale, by_org = last_scales({c.source.org for c in goal})
    if not by_org:
        raise BadInput("no fit to rescore: run `capbench validate --fit` once")
    out_of_sample = []
    for org, org_scale in sorted(by_org.items()):
        out_of_sample += replayer([c for c in goal if c.source.org == org], org_scale)
    write_validation(replayer(goal, scale), out_of_sample, by_org, replayer(excluded, scale))


def write_validation(in_sample: list[Replay], out_of_sample: list[Replay],
                     scales_by_org: dict[str, dict[str, float]], excluded: list[Replay]) -> None:
    """validation.json: the per-case errors in and out of sample."""

    def rows(replays: list[Replay]) -> list[dict]:
        return [{"case": r.case.key, "org": r.case.source.org, "gpu": r.case.gpu, "model": r.case.model,
                 "predicted": r.predicted, "errors": r.errors, "why_not": r.why_not} for r in replays]

    VALIDATION.write_text(json.dumps({
        "out_of_sample": {"summary": error_summary(out_of_sample), "cases": rows(out_of_sample),
                          "scales_by_left_out_org": scales_by_org},
        "in_sample": {"summary": error_summary(in_sample), "cases": rows(in_sample)},
        "excluded": rows(excluded),
    }, indent=1) + "\n")


def median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors) if errors else float("nan")


def stored_validation() -> dict | None:
    """validation.json of the last `capbench validate --fit` (out-of-sample errors), or None."""
    try:
        return json.loads(VALIDATION.read_text())
    except (OSError, ValueError):
        return None


def out_of_sample_bias(by: tuple[str, ...] = ("org",)) -> list[dict]:
    """validation.json's leave-one-source-out predictions over the published figures, grouped by any of "org",
    "version" (the case's SGLang version) and "gpu": each group's cases and, per figure, the median of
    predicted / published (above 1: the model too fast on throughput, too slow on latencies). [] before a fit."""
    from bench.model.evidence import corpus

    stored = stored_validation()
    if not stored:
        return []
    version = {c.key: c.sglang_version for c in corpus.load()}
    groups: dict[tuple, list[dict]] = {}
    for c in (stored.get("out_of_sample") or {}).get("cases") or []:  # a hand-edited file gives what it holds
        if isinstance(c, dict) and isinstance(c.get("errors"), dict) and c["errors"]:
            fields = {"org": c.get("org", "?"), "version": version.get(c.get("case"), "unknown"),
                      "gpu": c.get("gpu", "?")}
            groups.setdefault(tuple(fields[b] for b in by), []).append(c["errors"])
    return [{**dict(zip(by, k, strict=True)), "cases": len(errs),
             "ratio": {f: statistics.median(1 + e[f] for e in errs if f in e) for f in FIGURES
                       if any(f in e for e in errs)}}
            for k, errs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def closest_error(model_id: str, gpu: str) -> dict | None:
    """The out-of-sample error of the corpus cases closest to a deployment: same GPU and attention kind (MLA or
    GQA), else same attention kind, else all. The uncertainty reports quote. None before any --fit."""
    from bench.model.fits import catalog

    v = stored_validation()
    if not v:
        return None
    rows = [r for r in v["out_of_sample"]["cases"] if r["errors"]]
    kind = catalog.model(model_id).attention

    def attention(r: dict) -> str | None:
        try:
            return catalog.model(r["model"]).attention
        except Exception:  # noqa: BLE001 - a case of a model no longer in the catalog
            return None

    for label, pick in ((f"{kind.upper()} models on {gpu}", lambda r: r["gpu"] == gpu and attention(r) == kind),
                        (f"{kind.upper()} models", lambda r: attention(r) == kind), ("all models", lambda r: True)):
        near = [r for r in rows if pick(r)]
        if len(near) >= 5:
            out = {"basis": label, "cases": len(near)}
            for f in ("output_tok_s", "tpot_ms", "ttft_ms"):
                errs = [r["errors"][f] for r in near if f in r["errors"]]
                out[f] = median_abs(errs) if errs else None
            return out
    return None
