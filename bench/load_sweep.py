"""`capbench run --profile sweep`: one user (one request at a time), then bench/sweep.py's search, the one the
campaigns use: up the profile's rates (its `rates`, or `factors` x what one user achieved) while no stage saturates
(loadgen/profiles.py saturated: the server keeps up, the median latency holds, few errors) and the share of
requests within --slo holds (min_slo_attainment), then bisection between the last rate that held and the first
that did not until that bracket is at most `resolution` (5 %) wide or `refine` bisections were made. Each stage is
its own run in the store, with the sweep's id and its stage number.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from bench.live import print_sweep
from bench.store import Store, queries
from bench.sweep import Search, sweep
from loadgen import profiles

if TYPE_CHECKING:
    from loadgen.workloads import Workload


class _Stopped(Exception):
    """A sweep stage did not complete (aborted, failed): the sweep ends there."""


@dataclass
class _Point:  # one stage of `capbench run --profile sweep`, as bench/sweep.py judges it
    rate: float
    meets: bool
    why: str
    goodput: float  # requests/s done within the stage
    sure: bool = True  # a run's sweep keeps no per-request sample to resample: never anchored


class StageResult(Protocol):
    """What the sweep reads of one stage's run (bench/runner.py's RunResult)."""
    run_id: str
    status: str
    summary: dict


Result = TypeVar("Result", bound=StageResult)


def run_sweep(store: Store, opts: object, prof: profiles.Profile, wl: Workload, model: str,
              run_one: Callable[..., Result]) -> list[Result]:
    """One user, then bench/sweep.py's search (the campaign's): up the profile's rates while no stage saturates and
    the share within --slo holds, then bisection to the profile's resolution (5 %)."""
    p = prof.params
    stage_s = float(p.get("stage_duration", 30))
    sweep_id = f"sweep-{int(time.time())}"
    base = profiles.Profile("sweep-1user", "users", {"users": 1, "duration": stage_s})
    results = [run_one(store, opts, base, wl, model, {"sweep_id": sweep_id, "stage": 0, "offered_rps": None})]
    s0 = results[0].summary
    if results[0].status != "completed" or not s0.get("throughput_rps"):
        return results
    base_e2e = s0.get("e2e_p50") or 0.0
    rows: list[tuple[float | None, dict]] = [(None, s0)]
    min_share = float(p.get("min_slo_attainment", 0.9))

    def stage(rate: float) -> _Point:
        k = len(results)
        cap = {"max_concurrency": p["max_concurrency"]} if p.get("max_concurrency") else {}
        shape = profiles.Profile(f"sweep-{rate:.4g}rps", p.get("arrival", "poisson"),
                                 {"rate": rate, "duration": stage_s, **cap})
        res = run_one(store, opts, shape, wl, model, {"sweep_id": sweep_id, "stage": k, "offered_rps": rate},
                       warmup_s=0.0)
        results.append(res)
        s = res.summary
        # throughput: answers done within the stage plus one normal service time, per second of stage
        with store.connect() as con:
            done = queries.finished_within(con, res.run_id, stage_s + base_e2e) / stage_s
        why = profiles.saturated(rate, done, s.get("e2e_p50"), base_e2e, 1 - (s.get("success_rate") or 0.0), p)
        share = s.get("slo_attainment")
        if not why and share is not None and share < min_share:
            why = f"{share:.0%} of requests within the SLO < {min_share:.0%}"
        rows.append((rate, {**s, "throughput_rps": done, "saturated": bool(why)}))
        if res.status != "completed":
            raise _Stopped(res.status)
        return _Point(rate, not why, why or "", done)

    ladder = tuple(prof.sweep_rates(s0["throughput_rps"]))
    search = Search(ladder[0] if ladder else 1.0, max_stages=len(ladder) + int(p.get("refine", 4)),
                    refine=int(p.get("refine", 4)), min_gain=float(p.get("min_gain", 0.0)),
                    resolution=float(p.get("resolution", 0.05)), ladder=ladder)
    try:
        found = sweep(stage, search) if ladder else None
        if found is not None:
            print(f"sweep: {found.why}" + (f"; bracket {found.bracket:.1%}" if found.bracket is not None else ""))
    except _Stopped as e:
        print(f"sweep stops: the stage was {e}")
    print_sweep(rows, min_share)
    return results
