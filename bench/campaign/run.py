"""Running a campaign: for each deployment, launch it, wait for health, run every load (a sweep runs until
saturation), stop it, and go on. A deployment that fails to start, or dies mid-run, fails its cells with the
server's last log lines; the campaign continues. Ctrl-C or SIGTERM stops what was started and marks the campaign
aborted; `--resume` continues it, skipping completed cells. Every run is kept.

A sweep offers Poisson rates start, start x factor, ... while the SLO holds (the p-th percentile of each bound, and
99 % of requests served) and goodput (offered rate x share within the SLO) keeps rising by min_gain; then it bisects
`refine` times between the last rate within the SLO and the first past it. The cell's measured figure is that last
rate within the SLO; the model's figure is the same sweep (rates, stage length in the deployment's own time, warm-up
share) played by the simulator (bench/model/simulate.py) for the same deployment, workload and SLO, so both answer
one question. A short stage is not steady state: `capbench plan`'s converged rate (search_rate) is the longer-run
answer.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.campaign import guard, record
from bench.campaign.launch import Launched, LaunchFailed, tail
from bench.campaign.spec import Campaign, DeploymentSpec, Load, cell_key
from bench.errors import BadInput
from bench.model import Slo, catalog, interval, load_workload, pd_simulate, simulate, usd_per_million
from bench.store import Store

RUN_ERRORS_OK = 0.01  # a stage with a larger share of failed requests misses the SLO
MODEL_STAGES = 40  # the simulator's sweep is cheap: it goes on until the SLO breaks
CUT_OFF_TTFT = 1e9  # the TTFT counted for a request that had no first token when the run ended
CUT_OFF_KINDS = ("aborted", "cancelled")  # a request the run's end stopped (issue 18's loadgen says cancelled)
WARMUP_SHARE = 0.25  # of a stage's duration, run before it and not measured: the simulator's first 20 %


@dataclass
class Stage:
    rate: float  # offered, requests/s of the deployment's GPUs
    run_id: str
    summary: dict
    meets: bool
    why: str  # what missed, or ""

    @property
    def goodput(self) -> float:
        """Requests/s within the SLO: the offered rate times the share of requests that met it (a short stage's
        finished-per-second still counts the ramp, so it would stop rising before the server does)."""
        return self.rate * (self.summary.get("slo_attainment") or 0.0)


class Interrupt:
    """Ctrl-C and SIGTERM while the campaign runs: noted, and acted on between runs (the runner marks its own run
    aborted), so the servers started are stopped in order."""

    def __init__(self) -> None:
        self.hit = False
        try:
            import gevent

            self.handles = [gevent.signal_handler(s, self.note) for s in (signal.SIGINT, signal.SIGTERM)]
        except ImportError:
            self.handles = []

    def note(self, *_: object) -> None:
        self.hit = True

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def close(self) -> None:
        for h in self.handles:
            h.cancel()


def run_campaign(campaign: Campaign, db: Path, source: str = "", resume: bool = False, cid: str | None = None,
                 log_dir: Path | None = None, say: Callable[[str], None] | None = None) -> str:
    """Runs the campaign (or continues it: `resume`, or a queued `cid`); returns its id."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    store = Store(db)
    if cid is None and resume:
        cid = record.resumable(store, campaign)
        if cid is None:
            raise BadInput(f"no unfinished campaign {campaign.name!r} with this file in {db} to resume")
    cid = cid or record.new_campaign(store, campaign, source)
    record.set_status(store, cid, "running")
    done = record.completed_cells(store, cid)
    log_dir = log_dir or db.parent / "campaign-logs" / cid
    say(f"campaign {campaign.name} {cid}: {len(campaign.cells())} cells, {len(done)} already completed, into {db}")
    stop = Interrupt()
    status = "aborted"
    try:
        failed = 0
        for dep in campaign.deployments:
            todo = [x for x in campaign.loads if cell_key(dep, x) not in done]
            if todo:
                failed += _deployment(store, cid, campaign, dep, todo, log_dir, stop, say)
        status = "completed" if not failed else "failed"
    finally:
        stop.close()
        record.set_status(store, cid, status)
        say(f"campaign {cid} {status}")
    return cid


def _deployment(store: Store, cid: str, campaign: Campaign, dep: DeploymentSpec, loads: list[Load], log_dir: Path,
                stop: Interrupt, say: Callable[[str], None]) -> int:
    """Launch, run the loads, stop. Returns how many cells failed."""
    server = Launched(dep, log_dir)
    failed = 0
    try:
        say(f"{dep.name}: starting ({dep.kind})")
        try:
            server.start(lambda: stop.hit)
        except LaunchFailed as e:
            say(f"{dep.name}: failed to start: {e}" + (f"\n{e.log}" if e.log else ""))
            for load in loads:
                key = cell_key(dep, load)
                record.start_cell(store, cid, key, dep.name, load.name)
                record.finish_cell(store, cid, key, "failed", error=str(e), log=e.log)
            return len(loads)
        for load in loads:
            stop.check()
            key = cell_key(dep, load)
            record.start_cell(store, cid, key, dep.name, load.name)
            try:
                result = _cell(store, cid, dep, load, server, stop, say)
            except LaunchFailed as e:
                say(f"{key}: failed: {e}")
                record.finish_cell(store, cid, key, "failed", error=str(e), log=e.log)
                failed += 1
                if server.alive() is not None:
                    for rest in loads[loads.index(load) + 1:]:
                        k = cell_key(dep, rest)
                        record.start_cell(store, cid, k, dep.name, rest.name)
                        record.finish_cell(store, cid, k, "failed", error=f"{dep.name} is down: {e}", log=e.log)
                        failed += 1
                    break
                continue
            except BadInput as e:
                say(f"{key}: failed: {e}")
                record.finish_cell(store, cid, key, "failed", error=str(e))
                failed += 1
                continue
            record.finish_cell(store, cid, key, "completed", result)
            say(f"{key}: {_describe(result)}")
    finally:
        server.stop()
        say(f"{dep.name}: stopped")
    return failed


def _describe(r: dict) -> str:
    pred = r.get("predicted_rps")
    return (f"highest rate within the SLO {r['measured_rps']:.3g} req/s (model: "
            f"{'-' if pred is None else f'{pred:.3g}'}), {r['stages']} stages, {r['saturation']}")


def _cell(store: Store, cid: str, dep: DeploymentSpec, load: Load, server: Launched, stop: Interrupt,
          say: Callable[[str], None]) -> dict:
    from bench.runner import RunOptions  # Locust, and its gevent patching, only when a campaign runs
    from bench.runner import run as run_load

    key = cell_key(dep, load)
    scale = dep.time_scale
    slo = load.slo.scaled(scale)
    # after the last arrival, wait as long as a first token may take within the SLO: a request still without one
    # then misses it anyway, and one that has it is judged on it (_cut_off)
    drain = min(load.duration_s, 1.2 * slo.ttft_s + 0.5) if slo.ttft_s else load.duration_s

    def stage(rate: float | None, users: int | None = None) -> Stage:
        stop.check()
        if rate is not None:
            profile, over = "poisson", {"rate": rate * scale, "duration": load.duration_s}
            warmup = WARMUP_SHARE * load.duration_s
        else:
            profile, over = "users", {"users": users, "duration": load.duration_s}
            warmup = 0.0
        opts = RunOptions(target=server.url, profile=profile, overrides=over, workload=load.workload, db=store.path,
                          label=f"campaign {key}" + (f" @{rate:.3g}rps" if rate is not None else ""), slo=slo,
                          warmup_s=warmup, live=False, quiet=True, drain_s=drain,
                          api_key_env=guard.secret_env(dep.sglang.get("flags", [])),
                          run_config={"campaign": cid, "cell": key, "time_scale": scale,
                                      # what the server was offered, as a sweep stage of `capbench run` stores it
                                      "offered_rps": None if rate is None else rate * scale,
                                      **({"twin": dep.twin} if dep.twin else {})})
        with _telemetry("off" if dep.kind == "twin" else None):  # a twin models GPUs this host does not have
            res = run_load(opts)[-1]
        stop.check()
        if res.status != "completed":
            raise KeyboardInterrupt
        why = server.alive()
        if why is not None:
            raise LaunchFailed(f"{dep.name} went down during {key}: {why}", tail(server.log))
        summary = {**res.summary, **_cut_off(store, res.run_id, slo)}
        ok, miss = _meets(summary, slo, scale)
        s = Stage(rate or 0.0, res.run_id, summary, ok, miss)
        say(f"{key}: {'' if rate is None else f'{rate:.3g} req/s: '}goodput {s.goodput:.3g} req/s, "
            f"{'within the SLO' if ok else miss}")
        return s

    if load.profile != "sweep":
        s = stage(load.rate, load.users)
        stages, best, saturation = [s], s if s.meets else None, "one load point"
        predicted = _predicted(dep, load)
    else:
        predicted = _predicted(dep, load)
        start = load.sweep.start
        if load.sweep.from_model and predicted["predicted_rps"]:
            start = predicted["predicted_rps"]  # up or down from there by what the twin or server does
        stages, best, saturation = _sweep(load, stage, start)
    return {**_result(dep, load, stages, best, saturation), **predicted}


def _sweep(load: Load, stage: Callable[[float], Stage], start: float, max_stages: int | None = None
           ) -> tuple[list[Stage], Stage | None, str]:
    sw = load.sweep
    stages: list[Stage] = []
    best: Stage | None = None
    bad: float | None = None
    why = "search limit"
    rate = start
    while len(stages) < (max_stages or sw.max_stages):
        s = stage(rate)
        stages.append(s)
        if not s.meets:
            bad, why = rate, f"SLO broke at {rate:.3g} req/s ({s.why})"
            if best is not None:
                break
            rate /= sw.factor  # even the first rate misses: go down until one holds
            continue
        if best is not None and s.goodput < best.goodput * (1 + sw.min_gain):
            bad, why = rate, f"goodput stopped rising at {rate:.3g} req/s"
            break
        best = s
        if bad is not None:
            break  # came down from a miss to a rate that holds
        rate *= sw.factor
    for _ in range(sw.refine if best is not None and bad is not None and bad > best.rate else 0):
        mid = math.sqrt(best.rate * bad)
        s = stage(mid)
        stages.append(s)
        if s.meets and s.goodput >= best.goodput:
            best = s
        else:
            bad = mid
    return stages, best, why


def _meets(summary: dict, slo: Slo, scale: float = 1.0) -> tuple[bool, str]:
    """The stage's p-th percentiles within the SLO's bounds, and nearly every request served; the reason it misses
    in the modelled GPUs' time (a twin `scale` times faster: its latencies x scale), like the rates beside it."""
    if not summary.get("measured"):
        return False, "no request measured"
    failed = summary.get("failed", summary.get("errors") or 0) / summary["measured"]
    if failed > RUN_ERRORS_OK:
        return False, f"{failed:.0%} of requests failed"
    q = slo.percentile
    for name, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)):
        value = summary.get(f"{name}_p{q}")
        if bound is not None and value is not None and value > bound:
            if value >= CUT_OFF_TTFT:
                return False, f"over {100 - q} % of requests had no first token by the run's end"
            return False, f"{name.upper()} p{q} {value * scale:.3g} s > {bound * scale:.3g} s"
    return True, ""


@contextmanager
def _telemetry(value: str | None) -> Iterator[None]:
    before = os.environ.get("CAPBENCH_GPU_TELEMETRY")
    if value is not None:
        os.environ["CAPBENCH_GPU_TELEMETRY"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CAPBENCH_GPU_TELEMETRY", None)
        else:
            os.environ["CAPBENCH_GPU_TELEMETRY"] = before


def _cut_off(store: Store, run_id: str, slo: Slo) -> dict:
    """Failures, the TTFT percentile and the share within the SLO, counting the requests the run's end cut off as
    the simulator would: one that had its first token has its TTFT and is left out of the share (its tail says
    nothing about the rate); one that had none waited longer than the run (a TTFT past any bound). Requests that
    failed otherwise (HTTP errors, timeouts) are failures."""
    big = CUT_OFF_TTFT
    cut = ", ".join("?" * len(CUT_OFF_KINDS))
    with store.connect() as con:
        failed, ttft, good, counted = con.execute(
            f"SELECT count(*) FILTER (WHERE status <> 'ok' AND coalesce(error_kind, '') NOT IN ({cut})), "
            "quantile_disc(CASE WHEN first_token_at IS NULL AND status <> 'ok' THEN ? ELSE ttft_s END, ?), "
            "count(*) FILTER (WHERE status = 'ok' AND ttft_s <= ? AND coalesce(tpot_s, 0) <= ? AND e2e_s <= ?), "
            f"count(*) FILTER (WHERE status = 'ok' OR first_token_at IS NULL OR error_kind NOT IN ({cut})) "
            "FROM requests WHERE run_id = ? AND phase = 'measured'",
            [*CUT_OFF_KINDS, big, slo.percentile / 100, slo.ttft_s or big, slo.tpot_s or big, slo.e2e_s or big,
             *CUT_OFF_KINDS, run_id]).fetchone()
    out = {"failed": failed, "slo_attainment": good / counted if counted else 0.0}
    return out | ({f"ttft_p{slo.percentile}": ttft} if ttft is not None else {})


def _result(dep: DeploymentSpec, load: Load, stages: list[Stage], best: Stage | None, saturation: str) -> dict:
    """What the report reads: rates and tokens/s in the deployment's own time (a twin's divided by its scale)."""
    scale = dep.time_scale
    out_tps = (best.summary.get("output_tps") or 0.0) / scale if best else 0.0
    price = catalog.gpu(dep.gpu).price_per_gpu_hour if dep.model else None
    return {
        "measured_rps": best.rate if best else 0.0, "measured_output_tps": out_tps,
        "measured_usd_per_m": usd_per_million(price, dep.gpus, out_tps) if price and out_tps else None,
        "best_run": best.run_id if best else None, "stages": len(stages), "saturation": saturation,
        "points": [{"rate": s.rate, "run_id": s.run_id, "meets": s.meets, "why": s.why,
                    "goodput_rps": s.goodput, "ttft_p90": _unscaled(s.summary.get("ttft_p90"), scale),
                    "tpot_p90": _unscaled(s.summary.get("tpot_p90"), scale)} for s in stages],
        "slo": load.slo.text(), "time_scale": scale, "model": dep.model, "gpu": dep.gpu, "gpus": dep.gpus,
        "kv_dtype": dep.kv_dtype, "weights": dep.weights, "kv_checksum": dep.kv_checksum, "baseline": dep.baseline,
        "workload": load.workload, "finished_at": time.time(),
    }


def _unscaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _predicted(dep: DeploymentSpec, load: Load) -> dict:
    """The model's answer to the same question: the same sweep (rates, stage length in the deployment's time,
    warm-up) played by the simulator for this deployment, workload and SLO; its $ per 1M output tokens."""
    d = dep.deployment()
    if d is None or load.profile != "sweep" or dep.kv_checksum != "off":  # the model has no checksum cost
        return {"predicted_rps": None, "predicted_usd_per_m": None}
    wl = load_workload(load.workload)
    horizon = (1 + WARMUP_SHARE) * load.duration_s * dep.time_scale

    pd = dep.pd_shape()  # a disaggregated twin: its prefill and decode instances in virtual time

    def stage(rate: float) -> Stage:
        n = max(1, math.ceil(rate * horizon))
        p = (pd_simulate.run(pd, wl, rate, n, min_seconds=horizon) if pd else
             simulate.run(d, wl, rate, n, min_seconds=horizon))
        met = load.slo.met(p)  # the simulator gives percentiles, not each request: within the SLO, all count
        return Stage(rate, "", {"slo_attainment": 1.0 if met else 0.0, "output_tps": p.output_tok_s}, met, "")

    _, best, _ = _sweep(load, stage, load.sweep.start, MODEL_STAGES)
    tps = best.summary["output_tps"] if best else 0.0
    rps = best.rate if best else 0.0
    band = interval.predicted_range(d.model.id, d.gpu.id, d.weights, "output_tok_s", rps) if rps else None
    return {"predicted_rps": rps, "predicted_output_tps": tps,
            "predicted_rps_low": band[0] if band else None, "predicted_rps_high": band[1] if band else None,
            "predicted_usd_per_m": usd_per_million(d.gpu.price_per_gpu_hour, dep.gpus, tps) if tps else None}
