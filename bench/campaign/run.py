"""Running a campaign: for each deployment, launch it, wait for health, run every load (a sweep runs until
saturation), stop it, and go on. A deployment that fails to start, or dies mid-run, fails its cells with the
server's last log lines; the campaign continues. Ctrl-C or SIGTERM stops what was started and marks the campaign
aborted; `--resume` continues it, skipping completed cells. Every run is kept.

A sweep offers Poisson rates start, start x factor, ... while the SLO holds (the p-th percentile of each bound, and
99 % of requests served) and goodput (offered rate x share within the SLO) keeps rising by min_gain; then it bisects
`refine` times between the last rate within the SLO and the first past it. The cell's measured figure is that last
rate within the SLO; the model's figure is the same sweep (rates, stage length in the deployment's own time, warm-up
share) played by the simulator (bench/model/serving/simulate.py) for the same deployment, workload and SLO, so both
answer one question. A short stage is not steady state: `capbench plan`'s converged rate (search_rate) is the longer-run
answer. A stage that missed the SLO on a twin that fell behind its modelled pace (this host's CPU) is measured again.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.campaign import eval_stage, flags, own, predict, record, watchdog
from bench.campaign.launch import Launched, LaunchFailed, tail
from bench.campaign.pd_launch import PDLaunched
from bench.campaign.predict import WARMUP_SHARE
from bench.campaign.spec import Campaign, DeploymentSpec, Load, cell_key
from bench.campaign.stage import (
    COUNTS,
    RUN_ERRORS_OK,
    Stage,
    drain_s,
    flush_cache,
    judge,
    longest_answer,
    meets,
    requests_sample,
    shown,
    stage_counts,
    twin_behind_s,
    window_output_tps,
)
from bench.errors import BadInput
from bench.model import Interval, behind_said, bootstrap, catalog, mean_interval, usd_per_million
from bench.store import Store
from bench.sweep import Found, Search, sweep

RERUNS_BEHIND = 1  # more would stretch the demo past its 5 minutes on a host that is busy throughout


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
    predict.check_fits(campaign, source or campaign.name)  # before anything launches
    store = Store(db)
    if cid is None and resume:
        cid = record.resumable(store, campaign)
        if cid is None:
            raise BadInput(f"no unfinished campaign {campaign.name!r} with this file in {db} to resume")
    cid = cid or record.new_campaign(store, campaign, source)
    own.stop_timeout_s()  # a bad CAPBENCH_STOP_TIMEOUT_S: one line before anything runs
    owner = own.lock(db, cid)  # a second runner of this campaign is refused here
    stop = Interrupt()
    status = "aborted"
    dog = None
    mark = own.mark_item(db, cid)
    try:
        grace = max((d.stop_grace_s for d in campaign.deployments), default=30.0)
        own.stop_leftovers(store, db, grace, say, mine=cid)
        dog = watchdog.start(mark, grace)  # what this runner starts carries the mark: ended when the runner ends
        os.environ[mark.split("=", 1)[0]] = mark.split("=", 1)[1]
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
        os.environ.pop(mark.split("=", 1)[0], None)
        if dog is not None:
            watchdog.close(dog, grace)
        record.set_status(store, cid, status)
        owner.close()
        say(f"campaign {cid} {status}")
    return cid


def _deployment(store: Store, cid: str, campaign: Campaign, dep: DeploymentSpec, loads: list[Load], log_dir: Path,
                stop: Interrupt, say: Callable[[str], None]) -> int:
    """Launch, run the loads, stop. Returns how many cells failed."""
    server = PDLaunched(dep, log_dir, store, cid) if dep.pd else Launched(dep, log_dir, store, cid)
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


def _cell(store: Store, cid: str, dep: DeploymentSpec, load: Load, server: Launched | PDLaunched, stop: Interrupt,
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

    stages_run = [0]
    key_env = flags.secret_env(dep.sglang.get("flags", []))

    def stage(rate: float | None, users: int | None = None, seed: int = 0) -> Stage:
        """One load point. One that missed the SLO on a twin that fell behind its modelled pace may have missed for its
        host's CPU, not the modelled GPU: it is measured once more and the attempt that kept closer to its pace kept
        (both stay in the DB). A stage that met the SLO while behind stands: lag only overstates its latencies."""
        s, reruns = attempt(rate, users, seed), 0
        while reruns < RERUNS_BEHIND and not s.meets and behind_said(s.summary.get("twin_behind")):
            say(f"{key}: {'' if rate is None else f'{rate:.3g} req/s: '}measured again: the twin fell behind")
            reruns += 1
            s = min(s, attempt(rate, users, seed), key=lambda x: x.summary.get("twin_behind") or 0.0)
            s.summary["reruns"] = reruns
        return s

    def attempt(rate: float | None, users: int | None, seed: int) -> Stage:
        stop.check()
        stages_run[0] += 1
        # Each stage of a repeat resends the same prompts, at its own rate (a nested Poisson profile: common
        # requests), into a server whose prefix cache was just emptied, so that the stages differ in their rate
        # alone. A server that cannot flush would find them cached from the stage before (a warm cache the
        # model's fresh requests never have): there each stage draws prompts of its own.
        common = rate is not None and flush_cache(server.url, key_env)
        prompts = seed * 1000 if common else seed * 1000 + stages_run[0]
        if rate is not None:
            profile, over = "poisson", {"rate": rate * scale, "duration": load.duration_s,
                                        "max_concurrency": load.max_concurrency, "nested": True}
            warmup = WARMUP_SHARE * load.duration_s
        else:
            profile, over = "users", {"users": users, "duration": load.duration_s}
            warmup = 0.0
        opts = RunOptions(target=server.url, profile=profile, overrides=over, workload=load.workload, db=store.path,
                          label=f"campaign {key}" + (f" @{rate:.3g}rps" if rate is not None else "")
                          + (f" #{seed + 1}" if load.repeats > 1 else ""), slo=slo, seed=prompts,
                          warmup_s=warmup, live=False, quiet=True, drain_s=drain, late_after_s=slo.ttft_s,
                          gone=server.exited, api_key_env=key_env, gpu_metrics=dep.gpu_metrics,
                          run_config={"campaign": cid, "cell": key, "time_scale": scale, "repeat": seed,
                                      # what the server was offered, as a sweep stage of `capbench run` stores it
                                      "offered_rps": None if rate is None else rate * scale,
                                      **({"twin": dep.twin} if dep.twin else {})})
        behind0, began = (twin_behind_s(server.url) if dep.kind == "twin" else None), time.monotonic()
        try:
            with _telemetry("off" if dep.kind == "twin" else None):  # a twin models GPUs this host does not have
                res = run_load(opts)[-1]
        except BadInput:  # e.g. the model's name unreadable: a server that just died says so within a second
            _went_down(server, f"{dep.name} went down during {key}")
            raise
        stop.check()
        if res.status != "completed":
            raise KeyboardInterrupt
        _went_down(server, f"{dep.name} went down during {key}", wait_s=0.0)
        summary = {**res.summary, **judge(store, res.run_id, slo)}
        behind1 = twin_behind_s(server.url) if behind0 is not None else None
        if behind1 is not None:
            summary["twin_behind"] = (behind1 - behind0) / max(time.monotonic() - began, 1e-9)
        ok, miss = meets(summary, slo, scale)
        sample = requests_sample(store, res.run_id, slo, rate or 0.0, window_output_tps(summary, load.duration_s),
                                 prompts if common else None)
        sure = bootstrap.verdict_share(sample, slo.percentile, RUN_ERRORS_OK, ok) >= bootstrap.SURE
        s = Stage(rate or 0.0, res.run_id, summary, ok, miss, sample, sure)
        say(f"{key}: {'' if rate is None else f'{rate:.3g} req/s: '}goodput {s.goodput:.3g} req/s, "
            f"{'within the SLO' if ok else miss}; {stage_counts(summary)}"
            + (f"; {behind_said(summary.get('twin_behind'))}" if behind_said(summary.get("twin_behind")) else ""))
        return s

    search = _search(load)
    predicted = predict.predicted(dep, load, search) if search else {"predicted_rps": None,
                                                                      "predicted_usd_per_m": None}
    found = []
    during = eval_stage.start(load.eval, server.url, store.path, f"campaign {key} eval", key_env) \
        if load.eval and load.eval.when == "during" else None
    try:
        found = _repeats(load, key, search, predicted, stage, say)
    except BaseException:
        if during is not None:
            during.kill()
        raise
    quality = _quality(load, dep, server.url, store, key, key_env, during, say)
    return {**_result(dep, load, found), **predicted, **({"quality": quality} if quality else {})}


def _repeats(load: Load, key: str, search: Search | None, predicted: dict, stage: Callable, say: Callable) -> list:
    found = []
    for seed in range(load.repeats):
        if load.repeats > 1:
            say(f"{key}: repeat {seed + 1} of {load.repeats}")
        if search is None:
            s = stage(load.rate, load.users, seed)
            found.append(Found([s], s if s.meets else None, None, "one load point"))
            continue
        start = search.start
        if load.sweep.from_model and predicted["predicted_rps"]:
            start = predicted["predicted_rps"]  # up or down from there by what the twin or server does
        found.append(sweep(lambda rate, seed=seed: stage(rate, None, seed), replace(search, start=start)))
    return found


def _quality(load: Load, dep: DeploymentSpec, url: str, store: Store, key: str, key_env: str | None, during,
             say: Callable[[str], None]) -> dict | None:
    """The load's eval stage on the cell's server (eval_stage.py): its answers' run and pass rates, or its error."""
    if load.eval is None:
        return None
    say(f"{key}: eval {load.eval.suites} ({load.eval.when} the load)")
    proc = during or eval_stage.start(load.eval, url, store.path, f"campaign {key} eval", key_env)
    q = eval_stage.finish(proc, bool(dep.sglang.get("kv_scales") or (dep.pd and dep.pd.kv_scales)))
    say(f"{key}: eval " + (q["error"] if "error" in q else ", ".join(
        f"{s} {x['passed']}/{x['scored']} passed" for s, x in q["suites"].items())))
    return q


def _search(load: Load) -> Search | None:
    sw = load.sweep
    if sw is None:
        return None
    return Search(sw.start, sw.factor, sw.max_stages, sw.refine, sw.min_gain, sw.resolution)


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


def _went_down(server: Launched | PDLaunched, what: str, wait_s: float = 1.0) -> None:
    """Raise LaunchFailed, with the server's log, if its launched process has gone (waiting up to wait_s for it)."""
    end = time.monotonic() + wait_s
    while True:
        why = server.alive()
        if why is not None:
            raise LaunchFailed(f"{what}: {why}", tail(server.log))
        if time.monotonic() >= end:
            return
        time.sleep(0.1)


def _result(dep: DeploymentSpec, load: Load, found: list[Found]) -> dict:
    """What the report reads: rates and tokens/s in the deployment's own time (a twin's divided by its scale); with
    repeats, each figure is their mean with its 90 % interval (bench/model/evidence/confidence.py)."""
    scale = dep.time_scale
    price = catalog.gpu(dep.gpu).price_per_gpu_hour if dep.model else None
    rates = [f.best.rate if f.best else 0.0 for f in found]
    tps = [window_output_tps(f.best.summary, load.duration_s) / scale if f.best else 0.0 for f in found]
    usd = [usd_per_million(price, dep.gpus, t) for t in tps if price and t]
    goodput = [f.best.goodput if f.best else 0.0 for f in found]
    rate_i, usd_i, good_i = mean_interval(rates), mean_interval(usd) if usd else None, mean_interval(goodput)
    rate_i, good_i, usd_i, draws = _with_bootstrap(found, load, dep, rate_i, good_i, usd_i)
    middle = sorted(found, key=lambda f: f.best.rate if f.best else 0.0)[len(found) // 2]
    brackets = [f.bracket for f in found if f.bracket is not None]
    return {
        "measured_rps": rate_i.value, "measured_rps_interval": [rate_i.low, rate_i.high],
        "measured_goodput_rps": good_i.value, "measured_goodput_interval": [good_i.low, good_i.high],
        "measured_output_tps": sum(tps) / len(tps),
        "measured_usd_per_m": usd_i.value if usd_i else None,
        "measured_usd_per_m_interval": [usd_i.low, usd_i.high] if usd_i else [None, None],
        "interval_method": rate_i.method, "repeats": len(found), "repeats_rps": rates, **draws,
        "bracket": max(brackets) if brackets else None,
        "best_run": middle.best.run_id if middle.best else None,
        "stages": sum(len(f.stages) for f in found), "saturation": middle.why,
        "lower_bound": any(f.past is None and f.best is not None and load.profile == "sweep" for f in found),
        "points": [{"repeat": k, "rate": s.rate, "run_id": s.run_id, "meets": s.meets, "why": s.why,
                    "goodput_rps": s.goodput, "ttft_p90": shown(s.summary.get("ttft_p90"), scale),
                    "tpot_p90": shown(s.summary.get("tpot_p90"), scale),
                    # at the SLO's percentile, what the latency-against-load charts draw
                    "ttft": shown(s.summary.get(f"ttft_p{load.slo.percentile}"), scale),
                    "tpot": shown(s.summary.get(f"tpot_p{load.slo.percentile}"), scale),
                    "twin_behind": s.summary.get("twin_behind"), "reruns": s.summary.get("reruns", 0),
                    **{c: s.summary.get(c) for c in COUNTS}} for k, f in enumerate(found) for s in f.stages],
        "twin_behind": max((s.summary.get("twin_behind") or 0.0 for f in found for s in f.stages), default=None)
        if dep.kind == "twin" else None,
        "slo": load.slo.text(), "time_scale": scale, "stage_s": load.duration_s * scale,  # measured, modelled s
        "model": dep.model, "gpu": dep.gpu, "gpus": dep.gpus,
        "kv_dtype": dep.kv_dtype, "weights": dep.weights, "kv_checksum": dep.kv_checksum, "baseline": dep.baseline,
        "workload": load.workload, "flags": dep.sglang.get("flags", []), "twin": dep.twin,
        "parallel": {"tp": dep.gpus, "dp": dep.sglang.get("dp", 1), "ep": dep.sglang.get("ep", 1)},
        **({"disaggregated": {r.role: {"count": r.count, "tp": r.tp, "dp": r.dp, "ep": r.ep}
                              for r in (dep.pd.prefill, dep.pd.decode)}} if dep.pd else {}),
        "mem_fraction": predict.mem_fraction(dep), "percentile": load.slo.percentile,
        "finished_at": time.time(),
    }


def _with_bootstrap(found: list[Found], load: Load, dep: DeploymentSpec, *figures: Interval | None
                    ) -> tuple[Interval | None, ...]:
    """The rate, goodput and $ per 1M intervals from the bootstrap over the stages' requests
    (bench/model/evidence/bootstrap.py):
    with one repeat, the bootstrap's; with more, the wider of it and the t interval over the repeats. Also the
    draws of the rate's bracket ends, kept with the cell for the gains between cells."""
    samples = [[s.sample for s in f.stages if s.sample is not None] for f in found]
    if not all(samples):
        return (*figures, {})
    d = bootstrap.mean_draws([bootstrap.sweep_draws(ss, load.slo.percentile, RUN_ERRORS_OK, seed=k)
                              for k, ss in enumerate(samples)])
    price = catalog.gpu(dep.gpu).price_per_gpu_hour if dep.model else None
    tps = d.output_tps / dep.time_scale
    usd = price / 3600 * dep.gpus / tps[tps > 0] * 1e6 if price else np.zeros(0)
    ends = (bootstrap.interval(d.low, d.high), bootstrap.interval(d.goodput),
            bootstrap.interval(usd) if len(usd) else None)
    how = bootstrap.method(d.requests)
    out = tuple(i if i is None or e is None else bootstrap.wider(i, e, how) for i, e in zip(figures, ends, strict=True))
    keep = {"boot_low": [float(f"{v:.4g}") for v in d.low], "boot_high": [float(f"{v:.4g}") for v in d.high],
            "boot_requests": d.requests, "boot_paired": all(x.seed is not None for ss in samples for x in ss)}
    return (*out, keep)
