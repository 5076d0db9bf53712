"""The highest request rate one instance serves within the SLO: the figure every plan, report and Planner rests on.

A rate meets the SLO when `capbench simulate` at that Poisson rate meets its percentiles (an overloaded server's
queue shows in TTFT). The search starts at the throughput of a burst, doubles while the SLO holds, then bisects
until the bracket is within 2 %. It runs at a horizon of simulated arrivals, then at twice that horizon, and so
on until doubling the horizon moves the answer by under 5 % (converged), up to MAX_HORIZON_S. There is one
answer: no fast and slow modes. Answers are cached in memory and on disk (~/.cache/capbench/rates.json), keyed by a
hash of the deployment with its model's and GPU's data, the workload, the SLO, the model's factors and the
simulator's source and data (SIMULATOR, SIMULATOR_DATA), so the Planner asks each question once; the answers for
the built-in questions ship in data/plan-cache/rates.json (`make plan-cache`), read after your own cache: a change
to any of those inputs misses it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass, replace
from functools import cache
from pathlib import Path

from bench.model.fits.capacity import Deployment, capacity
from bench.model.fits.catalog import DATA
from bench.model.serving import simulate
from bench.model.serving.slo import Slo
from bench.model.serving.workload import Workload
from bench.model.step.calibration import Efficiency, kernels_per_layer, load_efficiency
from bench.model.step.perfmodel import attention_priced_by

START_HORIZON_S, START_REQUESTS = 60.0, 200
MAX_HORIZON_S = 960.0
CONVERGED = 0.05  # relative change of the answer when the horizon doubles
BRACKET = 1.02  # bisection stops when hi / lo is within this
BURST = 1000
MAX_DOUBLINGS = 10
# what an answer is computed by: the source of every module that sizes, schedules or prices a step, and the data
# files they read that the key holds nowhere else (the model's and GPU's data and the factors are in it already)
SIMULATOR = ("bench.model.serving", "bench.model.step", "bench.model.fits", "loadgen.workloads")
SIMULATOR_DATA = ("kernels/*.parquet", "expert_formats.yaml", "interconnect.yaml", "attention_backends.yaml",
                  "calibration/default.yaml")
# answers shipped for the built-in questions (`make plan-cache`), read after your own cache
SHIPPED_CACHE = DATA / "plan-cache" / "rates.json"


@dataclass(frozen=True)
class Prediction:
    rate_rps: float  # highest Poisson rate one instance sustains within the SLO (0: none)
    output_tps: float  # output tokens/s at that rate
    ttft_s: float  # at the SLO's percentile, at that rate
    tpot_s: float
    e2e_s: float
    batch: int  # mean requests running at that rate
    limited_by: str  # what the next higher rate missed: "TTFT p90", "TPOT p90", "E2E p90", or "search limit"
    horizon_s: float  # simulated seconds of arrivals per rate at the answer
    converged: bool  # doubling the horizon moved the answer by under 5 %
    change: float  # the last doubling's relative change of the answer

    @property
    def tps_per_user(self) -> float:
        """Output tokens/s each user sees at that rate (1 / TPOT)."""
        return 1.0 / self.tpot_s if self.tpot_s > 0 else 0.0


def waited(p: simulate.Point, slo: Slo) -> simulate.Point:
    """The point as its users see it behind a capped client: the wait for a free slot counts in TTFT and E2E (the
    sum of the two percentiles, an upper bound of the percentile of the sum)."""
    q = slo.percentile
    wait = getattr(p, f"slot_wait_p{q}")
    return replace(p, **{f"ttft_p{q}": getattr(p, f"ttft_p{q}") + wait, f"e2e_p{q}": getattr(p, f"e2e_p{q}") + wait})


def within_slo(p: simulate.Point, slo: Slo, cap: int | None = None) -> bool:
    """A simulated point (as simulate.run returns it) within the SLO; behind a capped client, as its users see it:
    the wait for a slot in TTFT and E2E (waited()), and the client's queue held."""
    return slo.met(p) if cap is None else slo.met(waited(p, slo)) and _queue_held(p, slo)


def _queue_held(p: simulate.Point, slo: Slo) -> bool:
    """An SLO that bounds neither TTFT nor E2E still needs the client's queue held: its wait under the median
    E2E (a queue that grows without end is never within an SLO)."""
    if slo.ttft_s is not None or slo.e2e_s is not None:
        return True
    return getattr(p, f"slot_wait_p{slo.percentile}") <= p.e2e_p50


def _limit(miss: simulate.Point, slo: Slo, cap: int | None = None) -> str:
    """Which SLO bound the first rate past the best one missed (the one missed by more), or the concurrency cap
    when the SLO held there but the capped client fell behind the arrivals."""
    q = slo.percentile
    if cap is not None and slo.met(miss):
        return f"max concurrency {cap} (the client's queue grows)"
    over = {name: getattr(miss, f"{metric}_p{q}") / bound
            for name, metric, bound in (("TTFT", "ttft", slo.ttft_s), ("TPOT", "tpot", slo.tpot_s),
                                        ("E2E", "e2e", slo.e2e_s)) if bound is not None}
    return f"{max(over, key=over.get)} p{q}"


def _prediction(p: simulate.Point | None, miss: simulate.Point | None, slo: Slo, limited: str, horizon: float,
                converged: bool = False, change: float = math.inf) -> Prediction:
    q = slo.percentile
    src = p or miss
    return Prediction(p.rate if p else 0.0, p.output_tok_s if p else 0.0, getattr(src, f"ttft_p{q}"),
                      getattr(src, f"tpot_p{q}"), getattr(src, f"e2e_p{q}"), round(p.mean_running) if p else 0,
                      limited, horizon, converged, change)


def _search(dep: Deployment, wl: Workload, slo: Slo, eff: Efficiency, n: int, horizon: float,
            start: float | None, tick: Callable[[], None], cap: int | None = None) -> Prediction:
    def at(rate: float) -> simulate.Point:
        tick()
        return simulate.run(dep, wl, rate, n, eff=eff, min_seconds=horizon, concurrency=cap)

    def met(p: simulate.Point) -> bool:
        return within_slo(p, slo, cap)

    def seen(p: simulate.Point | None) -> simulate.Point | None:  # the figures reported: as the users see them
        return p if p is None or cap is None else waited(p, slo)

    rate = start or max(simulate.run(dep, wl, math.inf, BURST, eff=eff).achieved_rps, 0.01)
    lo, best, hi, miss = 0.0, None, None, None
    p = at(rate)
    if met(p):
        lo, best = rate, p
        for _ in range(MAX_DOUBLINGS):  # up until the SLO breaks
            rate *= 2 if start is None else 1.1
            p = at(rate)
            if not met(p):
                hi, miss = rate, p
                break
            lo, best = rate, p
        if hi is None:
            return _prediction(seen(best), None, slo, "search limit", horizon)
    else:
        hi, miss = rate, p
        for _ in range(MAX_DOUBLINGS):  # down until it holds
            rate /= 2 if start is None else 1.1
            p = at(rate)
            if met(p):
                lo, best = rate, p
                break
            hi, miss = rate, p
        if best is None:
            return _prediction(None, seen(miss), slo, _limit(seen(miss), slo, cap), horizon)
    while hi / lo > BRACKET:
        mid = math.sqrt(lo * hi)
        p = at(mid)
        if met(p):
            lo, best = mid, p
        else:
            hi, miss = mid, p
    return _prediction(seen(best), seen(miss), slo, _limit(seen(miss), slo, cap), horizon)


def _key(dep: Deployment, wl: Workload, slo: Slo, eff: Efficiency, cap: int | None = None) -> str:
    """A hash of everything an answer rests on: the deployment with its model's and GPU's data, the workload, the SLO,
    the model's factors and the code that simulates. Change any of them and the cached answer is not found."""
    d = {k: v for k, v in asdict(dep).items() if k not in ("model", "gpu")}
    d["context"] = dep.context_len  # None means the model's maximum: one answer, one key
    d["attention"] = attention_priced_by(dep)  # its page size is in d already; backends priced alike share answers
    text = json.dumps([dep.model.model_dump(), dep.gpu.model_dump(), d, wl.to_dict(), asdict(slo), eff.to_dict(),
                       kernels_per_layer(), _code()] + ([{"max_concurrency": cap}] if cap else []),
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def simulator_files() -> list[Path]:
    """The files whose bytes key every cached answer (SIMULATOR's modules, SIMULATOR_DATA's files)."""
    files: list[Path] = []
    for name in SIMULATOR:
        path = Path(importlib.import_module(name).__file__)
        files += sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    for pattern in SIMULATOR_DATA:
        files += sorted(DATA.glob(pattern))
    return files


@cache
def _code() -> str:
    """The simulator's source and data: a change to how answers are computed is a change of key. A kernel table,
    kernel_step.py or the prefix cache edited leaves no cached answer standing (they once did: only eight modules
    were hashed)."""
    h = hashlib.sha256()
    for f in simulator_files():
        h.update(f"{f.parent.name}/{f.name}".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _cache_file() -> Path:
    return Path(os.environ.get("CAPBENCH_CACHE", Path.home() / ".cache" / "capbench")) / "rates.json"


_memory: dict[str, object] = {}


def _cached(key: str) -> Prediction | None:
    raw = _memory[key] if key in _memory else _read(key)
    try:
        return Prediction(**raw) if isinstance(raw, dict) else raw
    except TypeError:
        return None


_files: dict[Path, tuple[tuple, dict]] = {}  # each cache file as last parsed, with its (mtime, size) then


def _read(key: str) -> object:
    """One answer from your cache file, else from the shipped one; each parsed once per version of the file."""
    for path in (_cache_file(), *([SHIPPED_CACHE] if os.environ.get("CAPBENCH_SHIPPED_CACHE") != "0" else [])):
        hit = _parsed(path).get(key)
        if hit is not None:
            return hit
    return None


def _parsed(path: Path) -> dict:
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if path not in _files or _files[path][0] != stamp:
            data = json.loads(path.read_text())
            _files[path] = (stamp, data if isinstance(data, dict) else {})
        return _files[path][1]
    except (OSError, ValueError):
        return {}


def _store(key: str, value: Prediction | simulate.Point | float) -> None:
    _memory[key] = value
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:  # the search's workers add answers side by side
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(path.read_text()) if path.exists() else {}
            data[key] = asdict(value) if is_dataclass(value) else value
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)
    except (OSError, ValueError):
        pass  # a cache that cannot be written only costs time


def answer_key(dep: Deployment, wl: Workload, slo: Slo, cap: int | None = None) -> str:
    """The key search_rate caches its answer under: two deployments with one key have one answer (a search
    simulates each key once)."""
    return _key(dep, wl, slo, load_efficiency(dep.gpu.id), cap)


def search_rate(dep: Deployment, wl: Workload, slo: Slo, eff: Efficiency | None = None,
                progress: Callable[[], None] | None = None, cap: int | None = None) -> Prediction | None:
    """The converged highest rate within the SLO for one instance; None when the model does not fit. cap: the
    client keeps at most this many requests in flight to the instance (bench_serving --max-concurrency with
    --request-rate): Poisson arrivals wait for a free slot, and that wait counts in the TTFT and E2E the SLO
    judges (waited()), so a rate the capped client cannot keep up with is not served."""
    if not capacity(dep, with_ratios=False).fits:
        return None
    eff = eff or load_efficiency(dep.gpu.id)
    key = _key(dep, wl, slo, eff, cap)
    hit = _cached(key)
    if hit is not None:
        return hit
    tick = progress or (lambda: None)
    horizon, n = START_HORIZON_S, START_REQUESTS
    prev = _search(dep, wl, slo, eff, n, horizon, None, tick, cap)
    while True:
        if prev.rate_rps == 0:  # even the lowest rate misses: a longer horizon only lengthens the queue
            pred = Prediction(**{**asdict(prev), "converged": True, "change": 0.0})
            break
        if horizon >= MAX_HORIZON_S or prev.limited_by == "search limit":
            pred = prev
            break
        horizon, n = horizon * 2, n * 2
        pred = _search(dep, wl, slo, eff, n, horizon, prev.rate_rps or None, tick, cap)
        change = abs(pred.rate_rps / prev.rate_rps - 1) if prev.rate_rps else 0.0
        pred = Prediction(**{**asdict(pred), "change": change, "converged": change < CONVERGED})
        if pred.converged:
            break
        prev = pred
    _store(key, pred)
    return pred


def saturation_tps(dep: Deployment, wl: Workload, requests: int, eff: Efficiency | None = None) -> float:
    """Output tokens/s of `requests` requests sent at once (the plan's screen), cached like the rates."""
    eff = eff or load_efficiency(dep.gpu.id)
    key = "burst" + _key(dep, wl, Slo(), eff) + str(requests)
    hit = _memory.get(key, None) if key in _memory else _read(key)
    if isinstance(hit, int | float):
        return float(hit)
    tps = simulate.run(dep, wl, math.inf, requests, eff=eff).output_tok_s
    _store(key, tps)
    return tps


def simulated(dep: Deployment, wl: Workload, rate: float, requests: int, eff: Efficiency | None = None
              ) -> simulate.Point:
    """simulate.run at one rate, cached like the rates (the latency-against-load curve beside a plan)."""
    eff = eff or load_efficiency(dep.gpu.id)
    return _point("point" + _key(dep, wl, Slo(), eff) + f"{rate!r}/{requests}",
                  lambda: simulate.run(dep, wl, rate, requests, eff=eff))


def closed_loop(dep: Deployment, wl: Workload, concurrency: int, requests: int, eff: Efficiency | None = None
                ) -> simulate.Point:
    """simulate.run with `concurrency` requests always in flight (a configuration's curve), cached like the rates:
    the curves beside a plan are ~100 such runs (12-16 s of the demo's capacity report when not cached)."""
    eff = eff or load_efficiency(dep.gpu.id)
    return _point("closed" + _key(dep, wl, Slo(), eff) + f"{concurrency}/{requests}",
                  lambda: simulate.run(dep, wl, math.inf, requests, eff=eff, concurrency=concurrency))


def remembered(parts: list, compute: Callable[[], dict]) -> dict:
    """A JSON answer cached like the rates (memory, your cache file, the shipped one), keyed by a hash of `parts`
    and the simulator's source: what `capbench validate` replays, so a second run replays nothing."""
    key = "answer" + hashlib.sha256(json.dumps([parts, _code()], sort_keys=True, default=str).encode()).hexdigest()[:24]
    hit = _memory[key] if key in _memory else _read(key)
    if isinstance(hit, dict):
        return hit
    value = compute()
    _store(key, value)
    return value


def _point(key: str, compute: Callable[[], simulate.Point]) -> simulate.Point:
    hit = _memory[key] if key in _memory else _read(key)
    if isinstance(hit, dict):
        try:
            return simulate.Point(**hit)
        except TypeError:
            pass  # a Point of another shape: computed again
    p = compute()
    _store(key, p)
    return p
