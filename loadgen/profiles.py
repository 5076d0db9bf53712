"""Load profiles: when requests are sent.

Closed loop (`users`): N users, each sends its next request when the previous one ends (Locust's own model;
`stages` change N over time through a LoadTestShape).

Open loop (everything else): the arrival times are computed up front from a rate function r(t) and an arrival
process, seeded; each request is sent at its time whatever the earlier ones are doing, so a slow server shows up
as latency, not as a lower rate (no coordinated omission). Arrival times come from time rescaling: draw unit
gaps from the process (1 for constant, Exp(1) for Poisson, Gamma(k, 1/k) for gamma), and map their running sum
through the inverse of R(t) = integral of r. The count is fixed to round(R(T)) and the gaps are scaled to fill
[0, T] exactly, so a Poisson profile at 50 req/s for 60 s sends 3000 requests (uniform order statistics: still a
Poisson process, conditioned on its count) and achieved-vs-target compares the client, not the dice.

A `nested` Poisson profile (a campaign's sweep stages) draws its warm-up and its measured phase from streams of
their own. The unit gaps of a stream are the same whatever their count, so two stages of one seed at different
rates send the same requests in the same order, the faster one's arrival times the slower one's compressed
(common random numbers: what differs between the stages is the rate, not the dice), each with its exact count.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from locust import LoadTestShape

from bench import files
from bench.errors import BadInput

DATA = Path(__file__).resolve().parent.parent / "data" / "profiles"
OPEN_TYPES = ("constant", "poisson", "gamma", "ramp", "steps", "spike", "diurnal", "trace")
TYPES = ("users", *OPEN_TYPES, "sweep")
MAX_SCHEDULE = 5_000_000  # arrival times held in memory for one run (tens of MB); more is refused up front
PARAMS = {  # what each type reads: anything else is a typo, said so rather than ignored
    "users": {"users", "duration", "spawn_rate", "think_s", "stages"},
    "constant": {"rate", "duration", "max_concurrency"},
    "poisson": {"rate", "duration", "max_concurrency", "nested"},
    "gamma": {"rate", "duration", "burstiness", "max_concurrency"},
    "ramp": {"start_rate", "end_rate", "duration", "arrival", "max_concurrency"},
    "steps": {"rates", "step_duration", "arrival", "max_concurrency"},
    "spike": {"rate", "spike_rate", "spike_at", "spike_duration", "duration", "arrival", "max_concurrency"},
    "diurnal": {"min_rate", "max_rate", "period", "duration", "arrival", "max_concurrency"},
    "sweep": {"stage_duration", "arrival", "rates", "factors", "max_rate", "min_achieved_ratio", "max_latency_ratio",
              "max_error_rate", "min_slo_attainment", "burstiness", "max_concurrency", "refine", "resolution"},
    "trace": {"path", "speedup", "max_requests", "max_concurrency"},
}
# max_concurrency (open loop): at most N requests in flight; an arrival that finds N waits in the client for a free
# slot, as sglang.bench_serving's --max-concurrency semaphore does. Its latencies count from the slot, as
# bench_serving's do; the wait is recorded beside them (slot_wait_s) and counts in the SLO a campaign judges.


class ProfileError(ValueError):
    """A profile file or parameter that cannot be used."""


@dataclass
class Profile:
    name: str
    type: str
    params: dict = field(default_factory=dict)

    @property
    def open_loop(self) -> bool:
        return self.type in OPEN_TYPES

    def p(self, key: str, default: object = None) -> object:
        v = self.params.get(key, default)
        if v is None:
            raise ProfileError(f"profile {self.name} ({self.type}) needs `{key}`")
        return v

    @property
    def duration(self) -> float:
        if self.type == "trace":
            off = self.trace_offsets()
            return float(off[-1]) if len(off) else 0.0
        if self.type == "steps":
            return float(self.p("step_duration")) * len(self.p("rates"))
        if self.type == "users" and self.params.get("stages"):
            return float(sum(s["duration"] for s in self.params["stages"]))
        return float(self.p("duration"))

    # ---- open loop ---------------------------------------------------------------------------------------------
    def rate(self, t: np.ndarray) -> np.ndarray:
        """Target requests/s at profile time t (seconds since the measured phase began)."""
        t = np.asarray(t, dtype=np.float64)
        kind = self.type
        if kind in ("constant", "poisson", "gamma"):
            return np.full_like(t, float(self.p("rate")))
        if kind == "ramp":
            a, b, d = float(self.p("start_rate")), float(self.p("end_rate")), self.duration
            return a + (b - a) * np.clip(t / d, 0, 1)
        if kind == "steps":
            rates, step = np.asarray(self.p("rates"), dtype=np.float64), float(self.p("step_duration"))
            return rates[np.clip((t // step).astype(int), 0, len(rates) - 1)]
        if kind == "spike":
            base, peak = float(self.p("rate")), float(self.p("spike_rate"))
            at, length = float(self.p("spike_at", self.duration / 2)), float(self.p("spike_duration", 10))
            return np.where((t >= at) & (t < at + length), peak, base)
        if kind == "diurnal":
            lo, hi, period = float(self.p("min_rate")), float(self.p("max_rate")), float(self.p("period", 3600))
            return lo + (hi - lo) * 0.5 * (1 - np.cos(2 * np.pi * t / period))
        raise ProfileError(f"profile type {kind} has no rate function")

    @property
    def nested(self) -> bool:
        """Common requests across rates: the warm-up and the measured phase each from a stream of its own."""
        return self.type == "poisson" and bool(self.params.get("nested"))

    def peak_rate(self) -> float:
        if self.type == "trace":  # the busiest second of the trace
            off = self.trace_offsets()
            return float(max(1, np.max(np.searchsorted(off, off + 1.0) - np.arange(len(off))))) if len(off) else 1.0
        grid = np.linspace(0, self.duration, 2001)
        return float(self.rate(grid).max())

    def arrivals(self, seed: int = 0, warmup_s: float = 0.0) -> np.ndarray:
        """Offsets (seconds from the schedule's start) of every request, warm-up first. The warm-up runs at the
        profile's initial rate; the measured phase follows it."""
        if self.type == "trace":
            return warmup_s + self.trace_offsets()
        rng = np.random.default_rng([seed, 1] if self.nested else seed)
        parts = []
        if warmup_s > 0:
            w = Profile(self.name, "constant" if self.type == "constant" else "poisson",
                        {"rate": float(self.rate(np.zeros(1))[0]), "duration": warmup_s})
            parts.append(w._times(rng, "constant" if self.type == "constant" else "poisson"))
        process = {"constant": "constant", "gamma": "gamma"}.get(self.type, self.params.get("arrival", "poisson"))
        parts.append(warmup_s + self._times(np.random.default_rng([seed, 2]) if self.nested else rng, process))
        return np.concatenate(parts)

    def _times(self, rng: np.random.Generator, process: str) -> np.ndarray:
        T = self.duration
        grid = np.linspace(0.0, T, max(2, min(int(T * 100), 10**6) + 1))  # 10 ms steps for R(t), 1e6 at most
        r = np.maximum(self.rate(grid), 0.0)
        cum = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(grid))])
        n = int(round(cum[-1]))
        if n == 0:
            return np.empty(0)
        if process == "constant":
            gaps = np.ones(n + 1)
            gaps[0] = gaps[-1] = 0.5  # evenly spaced, half a gap at each end
        elif process == "poisson":
            gaps = rng.exponential(1.0, n + 1)
        elif process == "gamma":
            k = float(self.p("burstiness", 1.0))
            if k <= 0:
                raise ProfileError("burstiness must be > 0 (1 = Poisson, < 1 burstier, > 1 more regular)")
            gaps = rng.gamma(k, 1.0 / k, n + 1)
        else:
            raise ProfileError(f"unknown arrival process {process!r} (constant, poisson, gamma)")
        units = np.cumsum(gaps)[:-1] / gaps.sum() * cum[-1]
        return np.interp(units, cum, grid)

    # ---- trace -------------------------------------------------------------------------------------------------
    def trace_rows(self) -> list[dict]:
        """Mooncake-style JSONL: {timestamp (ms), input_length, output_length, hash_ids}; sorted by time."""
        if "_rows" not in self.params:
            path = Path(str(self.p("path")))
            if not path.is_file() and not path.is_absolute():
                path = DATA.parent.parent / path  # built-in profiles name repo files
            if not path.is_file():
                raise ProfileError(f"trace profile: no file at {path}")
            rows = []
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    row["timestamp"] = float(row["timestamp"])
                except (ValueError, KeyError, TypeError):
                    raise ProfileError(f"trace {path}:{n}: not a JSON object with a timestamp") from None
                rows.append(row)
            rows.sort(key=lambda r: r["timestamp"])
            limit = self.params.get("max_requests")
            self.params["_rows"] = rows[: int(limit)] if limit else rows
        return self.params["_rows"]

    def trace_offsets(self) -> np.ndarray:
        if "_offsets" in self.params:  # a prompt file's own timestamps (loadgen/prompt_file.replay), in seconds
            off = np.asarray(self.params["_offsets"], dtype=np.float64)[: self.params.get("max_requests") or None]
            return off / float(self.params.get("speedup", 1.0))
        rows = self.trace_rows()
        if not rows:
            return np.empty(0)
        ts = np.array([r["timestamp"] for r in rows]) / 1000.0  # Mooncake timestamps are milliseconds
        return (ts - ts[0]) / float(self.params.get("speedup", 1.0))

    # ---- sweep ---------------------------------------------------------------------------------------------------
    def sweep_rates(self, baseline_rps: float) -> list[float]:
        """The rates to try after the one-at-a-time stage: the profile's own list, or multiples of the rate one
        user achieved (so the sweep starts where the server is idle and climbs geometrically)."""
        if self.params.get("rates"):
            return [float(r) for r in self.params["rates"]]
        factors = self.params.get("factors", [1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
        cap = float(self.params.get("max_rate", 1e9))
        return [float(f"{baseline_rps * f:.3g}") for f in factors if baseline_rps * f <= cap]


def saturated(offered: float, achieved: float, latency: float | None, base_latency: float | None,
              error_rate: float, params: dict) -> str | None:
    """Why a sweep stage counts as saturated, or None: the server did not keep up with the offered rate, the
    median latency blew up against the one-at-a-time stage, or too many requests failed."""
    if achieved < offered * float(params.get("min_achieved_ratio", 0.9)):
        return f"achieved {achieved:.2f} req/s < {params.get('min_achieved_ratio', 0.9)} x offered {offered:.2f}"
    blowup = float(params.get("max_latency_ratio", 5.0))
    if latency is not None and base_latency and latency > blowup * base_latency:
        return f"median e2e {latency:.3f}s > {blowup} x one-at-a-time {base_latency:.3f}s"
    if error_rate > float(params.get("max_error_rate", 0.05)):
        return f"error rate {error_rate:.1%}"
    return None


class StagesShape(LoadTestShape):
    """Locust's own shape for the closed loop: (users, duration) stages, then stop."""

    def __init__(self, stages: list[tuple[int, float]], spawn_rate: float):
        super().__init__()
        self.ends = list(np.cumsum([d for _, d in stages]))
        self.users = [u for u, _ in stages]
        self.spawn_rate = spawn_rate
        self.extra_done = None  # set by whoever runs it: a callable that says the drain is over

    def tick(self) -> tuple[int, float] | None:
        t = self.get_run_time()
        for end, users in zip(self.ends, self.users, strict=True):
            if t < end:
                return users, self.spawn_rate
        if self.extra_done is not None and not self.extra_done(t - self.ends[-1]):
            return self.users[-1], self.spawn_rate
        return None


class PoolShape(LoadTestShape):
    """The open loop's shape: a fixed pool of users that take arrival slots from the shared schedule; it stops
    when `done(run_time)` says every request is accounted for (or the drain time is over)."""

    def __init__(self, pool: int, done):
        super().__init__()
        self.pool, self.done = pool, done

    def tick(self) -> tuple[int, float] | None:
        return None if self.done(self.get_run_time()) else (self.pool, float(self.pool))


# ---- loading ---------------------------------------------------------------------------------------------------
def names() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.yaml"))


def load(name_or_path: str, overrides: dict | None = None) -> Profile:
    """A built-in name (data/profiles/NAME.yaml) or a YAML file path; `overrides` (from the command line) win."""
    path = Path(name_or_path)
    if not path.exists():
        path = DATA / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ProfileError(f"unknown profile {name_or_path!r}: not a file, and not one of {', '.join(names())}")
    try:  # a regular file, without aliases, nested at most 24 levels (bench/files.py)
        spec = files.read(path, "profile", "yaml") or {}
    except BadInput as e:
        raise ProfileError(str(e)) from None
    if not isinstance(spec, dict):
        raise ProfileError(f"profile {path}: expected a mapping")
    kind = spec.pop("type", path.stem)
    if kind not in TYPES:
        raise ProfileError(f"profile {path}: unknown type {kind!r} (one of {', '.join(TYPES)})")
    name = str(spec.pop("name", path.stem))
    spec.pop("description", None)
    params = {**spec, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if isinstance(params.get("path"), str) and Path(params["path"]).is_file():  # the same file in every process
        params["path"] = str(Path(params["path"]).resolve())
    prof = Profile(name, kind, params)
    _check(prof)
    return prof


def _check(prof: Profile) -> None:
    unknown = sorted(set(prof.params) - PARAMS[prof.type])
    if unknown:
        raise ProfileError(f"profile {prof.name} ({prof.type}) has no parameter {', '.join(unknown)}; it takes "
                           f"{', '.join(sorted(PARAMS[prof.type]))}")
    if not isinstance(prof.params.get("nested", False), bool):
        raise ProfileError(f"profile {prof.name}: nested must be true or false, not {prof.params['nested']!r}")
    for key, v in prof.params.items():
        if key == "nested":
            continue
        values = v if key in ("rates", "factors") and isinstance(v, list) else [v]
        for x in values:
            if isinstance(x, bool) or (isinstance(x, int | float) and not (0 <= x < math.inf)):
                raise ProfileError(f"profile {prof.name}: {key} must be a finite number >= 0, not {x!r}")
    for key in ("rate", "start_rate", "end_rate", "spike_rate", "min_rate", "max_rate", "duration", "users"):
        v = prof.params.get(key)
        if v is not None and not isinstance(v, int | float):
            raise ProfileError(f"profile {prof.name}: {key} must be a non-negative number, not {v!r}")
    cap = prof.params.get("max_concurrency")
    if cap is not None and not (isinstance(cap, int) and cap >= 1):
        raise ProfileError(f"profile {prof.name}: max_concurrency must be a whole number >= 1, not {cap!r}")
    v = prof.params.get("refine")
    if v is not None and not (isinstance(v, int) and 0 <= v <= 20):
        raise ProfileError(f"profile {prof.name}: refine must be a whole number of bisections 0-20, not {v!r}")
    for key in ("speedup", "burstiness", "period", "step_duration", "stage_duration", "resolution"):
        v = prof.params.get(key)
        if v is not None and not (isinstance(v, int | float) and v > 0):
            raise ProfileError(f"profile {prof.name}: {key} must be a number > 0, not {v!r}")
    if prof.type in OPEN_TYPES and prof.type != "trace":
        expected = prof.peak_rate() * prof.duration  # raises on a missing parameter
        if expected > MAX_SCHEDULE:
            raise ProfileError(f"profile {prof.name}: about {expected:.3g} requests (peak rate x duration); a schedule "
                               f"is at most {MAX_SCHEDULE:,} requests: lower the rate or the duration")
    if prof.type == "trace" and prof.params.get("path"):  # without one, a prompt file's timestamps are the schedule
        prof.trace_rows()
    if prof.type == "users" and not prof.params.get("stages"):
        prof.p("users"), prof.p("duration")
