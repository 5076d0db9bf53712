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
from pathlib import Path

from bench.campaign import own, record
from bench.campaign.launch import Launched, LaunchFailed, tail
from bench.campaign.spec import Campaign, DeploymentSpec, Load, cell_key
from bench.campaign.stage import COUNTS, Stage, drain_s, judge, longest_answer, meets, shown, stage_counts
from bench.errors import BadInput
from bench.model import catalog, load_workload, simulate, usd_per_million
from bench.store import Store

MODEL_STAGES = 40  # the simulator's sweep is cheap: it goes on until the SLO breaks
WARMUP_SHARE = 0.25  # of a stage's duration, run before it and not measured: the simulator's first 20 %


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
    owner = own.lock(db, cid)  # a second runner of this campaign is refused here
    stop = Interrupt()
    status = "aborted"
    try:
        grace = max((d.stop_grace_s for d in campaign.deployments), default=30.0)
        own.stop_leftovers(store, db, grace, say, mine=cid)
        record.set_status(store, cid, "running")
        done = record.completed_cells(store, cid)
        log_dir = log_dir or db.parent / "campaign-logs" / cid
        say(f"campaign {campaign.name} {cid}: {len(campaign.cells())} cells, {len(done)} already completed, "
            f"into {db}")
        failed = 0
        for dep in campaign.deployments:
            todo = [x for x in campaign.loads if cell_key(dep, x) not in done]
            if todo:
                failed += _deployment(store, cid, campaign, dep, todo, log_dir, stop, say)
        status = "completed" if not failed else "failed"
    finally:
        stop.close()
        record.set_status(store, cid, status)
        owner.close()
        say(f"campaign {cid} {status}")
    return cid


def _deployment(store: Store, cid: str, campaign: Campaign, dep: DeploymentSpec, loads: list[Load], log_dir: Path,
                stop: Interrupt, say: Callable[[str], None]) -> int:
    """Launch, run the loads, stop. Returns how many cells failed."""
    server = Launched(dep, log_dir, store, cid)
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
    # after the last arrival, the requests still running are waited for up to the SLO's bound for a full answer;
    # what is still running then is cut off and counts as a miss (bench/campaign/stage.py)
    drain = drain_s(slo, longest_answer(load.workload))
    drain = load.duration_s if drain is None else drain

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
        summary = {**res.summary, **judge(store, res.run_id, slo)}
        ok, miss = meets(summary, slo, scale)
        s = Stage(rate or 0.0, res.run_id, summary, ok, miss)
        say(f"{key}: {'' if rate is None else f'{rate:.3g} req/s: '}goodput {s.goodput:.3g} req/s, "
            f"{'within the SLO' if ok else miss}; {stage_counts(summary)}")
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
                    "goodput_rps": s.goodput, "ttft_p90": shown(s.summary.get("ttft_p90"), scale),
                    "tpot_p90": shown(s.summary.get("tpot_p90"), scale),
                    **{k: s.summary.get(k) for k in COUNTS}} for s in stages],
        "slo": load.slo.text(), "time_scale": scale, "model": dep.model, "gpu": dep.gpu, "gpus": dep.gpus,
        "kv_dtype": dep.kv_dtype, "weights": dep.weights, "kv_checksum": dep.kv_checksum, "baseline": dep.baseline,
        "workload": load.workload, "finished_at": time.time(),
    }


def _predicted(dep: DeploymentSpec, load: Load) -> dict:
    """The model's answer to the same question: the same sweep (rates, stage length in the deployment's time,
    warm-up) played by the simulator for this deployment, workload and SLO; its $ per 1M output tokens."""
    d = dep.deployment()
    if d is None or load.profile != "sweep" or dep.kv_checksum != "off":  # the model has no checksum cost
        return {"predicted_rps": None, "predicted_usd_per_m": None}
    wl = load_workload(load.workload)
    horizon = (1 + WARMUP_SHARE) * load.duration_s * dep.time_scale

    def stage(rate: float) -> Stage:
        p = simulate.run(d, wl, rate, max(1, math.ceil(rate * horizon)), min_seconds=horizon)
        met = load.slo.met(p)  # the simulator gives percentiles, not each request: within the SLO, all count
        return Stage(rate, "", {"slo_attainment": 1.0 if met else 0.0, "output_tps": p.output_tok_s}, met, "")

    _, best, _ = _sweep(load, stage, load.sweep.start, MODEL_STAGES)
    tps = best.summary["output_tps"] if best else 0.0
    return {"predicted_rps": best.rate if best else 0.0, "predicted_output_tps": tps,
            "predicted_usd_per_m": usd_per_million(d.gpu.price_per_gpu_hour, dep.gpus, tps) if tps else None}
