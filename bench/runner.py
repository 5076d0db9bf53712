"""A load-test run: Locust as a library (headless), loadgen's users and profiles, every request into the store.

One process (LocalRunner) or Locust's master with N local worker processes (`workers=N`), plus any number of
`capbench worker --master HOST` processes from other machines. Workers send their result records to the master as
Locust custom messages; the master pipes them to its recorder process (bench/store/recorder.py), the only writer of
the DuckDB file, which also runs the NVML and server samplers: nothing but Locust runs on the timing event loop.
Ctrl-C or SIGTERM: no new request is sent, requests in flight get a `cancelled` record, the run is marked aborted,
everything measured is kept. Every request sent ends in one stored row: RunResult.sent vs rows_written.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import gevent
from locust.env import Environment
from locust.exception import RPCError

from bench import load_sweep, local_workers
from bench.checks import check_target
from bench.collector import Collector
from bench.errors import BadInput
from bench.live import Live, print_summary
from bench.model import Slo
from bench.request_shape import request_shape  # noqa: F401  (the CLI reaches it here)
from bench.store import HELD_DB_WAIT_S, Recorder, Store, queries
from bench.twin import Target
from loadgen import profiles, prompt_file, sessions, workloads
from loadgen.users import ClosedLoopUser, OpenLoopUser
from loadgen.worker import RECORDS_MSG, locust_options

log = logging.getLogger(__name__)
DRAIN_GRACE_S = 5.0  # past duration + drain, the run stops whatever the shape says
POLL_S = 0.1  # how often the run looks whether it is over
FLUSH_S = 0.5  # how often it stores what came in and redraws the live table
logging.getLogger("locust").setLevel(logging.ERROR)  # its spawn-rate advice does not apply to a pool of waiters


@dataclass
class RunOptions:
    target: str  # base URL of an OpenAI-compatible server (twin: targets are resolved before)
    profile: str = "poisson"
    overrides: dict = field(default_factory=dict)  # rate, users, duration, ... from the command line
    workload: str = "chat"
    lengths: tuple[str, str] | None = None  # --input-len/--output-len: a synthetic workload instead
    db: Path = Path("data/capbench.duckdb")
    label: str = ""
    model: str | None = None
    api_key_env: str | None = None
    slo: Slo = field(default_factory=Slo)
    warmup_s: float = 0.0
    workers: int = 0  # local worker processes (0: everything in this process)
    expect_workers: int = 0  # more workers joining from other machines
    master_bind: str = "127.0.0.1"
    master_port: int = 0
    seed: int = 0
    stream: bool = True
    api: str | None = None  # chat | completions (default: the workload's)
    timeout_s: float = 600.0
    read_timeout_s: float = 120.0
    drain_s: float = 60.0
    late_after_s: float | None = None  # a TTFT bound: the run ends once every request in flight is past it (misses)
    gone: Callable[[], bool] | None = None  # the run ends as soon as this says the server is gone (its process exited)
    max_inflight: int | None = None
    live: bool = True
    quiet: bool = False  # no start line, no summary table (the demo prints its own)
    run_config: dict = field(default_factory=dict)  # extra facts to keep with the run (e.g. the twin spec)
    request_shape: dict = field(default_factory=dict)  # extra_body, headers_env, targets, route (request_shape())
    gpu_metrics: tuple[str, ...] = ()  # the GPU nodes' Prometheus endpoints (DCGM exporter), scraped during the run
    gpu_metrics_interval_s: float = 1.0


@dataclass
class RunResult:
    run_id: str
    status: str
    summary: dict
    locust_requests: int  # what Locust's own statistics counted
    locust_failures: int
    records: int  # what reached the runner
    rows_written: int  # what the recorder wrote to the requests table
    sent: int = 0  # requests the users sent (each one owes a row)
    error: str | None = None  # why the run failed (the DB could not be written), in one line

    @property
    def lost(self) -> int:
        return max(0, self.sent - self.rows_written)


def discover_model(target: str, api_key_env: str | None) -> str:
    import httpx

    from bench import http

    headers = {"Authorization": f"Bearer {os.environ.get(api_key_env, '')}"} if api_key_env else {}
    url = target.rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        r = http.get(url, headers=headers, timeout=10)
        r.raise_for_status()
        model = r.json()["data"][0]["id"]
        if not isinstance(model, str) or not model:
            raise ValueError(f"the first model id is {model!r}")
        return model
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as e:
        raise BadInput(f"cannot read the model name from {url} ({type(e).__name__}: {e}); pass --model") from None


def prepare(opts: RunOptions) -> tuple[profiles.Profile, workloads.Workload, str]:
    try:
        prof = profiles.load(opts.profile, opts.overrides)
        wl_name = "trace" if prof.type == "trace" and opts.workload == "chat" else opts.workload
        if opts.lengths:
            wl = workloads.synthetic(*opts.lengths, opts.seed, opts.api)
        elif wl_name == "trace":
            wl = workloads.from_dict({"name": "trace", "type": "trace"}, opts.seed, opts.api)
        else:
            wl = workloads.load(wl_name, opts.seed, opts.api)
        wl.check()  # its file read now: unreadable or of the wrong format, nothing is sent (exit 2)
        prompt_file.replay(prof, wl)  # --profile trace with a timestamped prompt file: its times are the schedule
    except (profiles.ProfileError, workloads.WorkloadError) as e:
        raise BadInput(str(e)) from None
    if opts.max_inflight is not None and opts.max_inflight < 1:
        raise BadInput(f"--max-inflight must be >= 1, not {opts.max_inflight}")
    if opts.api_key_env:
        if not os.environ.get(opts.api_key_env):
            raise BadInput(f"environment variable {opts.api_key_env} (--api-key-env) is not set")
    model = opts.model or discover_model(opts.target, opts.api_key_env)
    return prof, wl, model


def run(opts: RunOptions) -> list[RunResult]:
    """A run (or, for the sweep profile, one run per stage). Results in the order they ran."""
    if not opts.target.startswith("twin:"):
        check_target(opts.target)
    opts = replace(opts, gpu_metrics=tuple(check_target(u, "--gpu-metrics") for u in opts.gpu_metrics))
    if not opts.gpu_metrics_interval_s > 0:
        raise BadInput(f"--gpu-metrics-interval must be positive, not {opts.gpu_metrics_interval_s}")
    opts = replace(opts, db=Path(opts.db).resolve())  # one file for this process, the recorder and the workers
    target = Target(opts.target)
    try:
        if target.spec:
            opts = replace(opts, target=target.url, run_config={**opts.run_config, "twin": target.spec})
        prof, wl, model = prepare(opts)
        store = Store(opts.db, lock_timeout_s=HELD_DB_WAIT_S)
        if prof.type != "sweep":
            return [_run_one(store, opts, prof, wl, model)]
        return load_sweep.run_sweep(store, opts, prof, wl, model, _run_one)
    finally:
        target.close()


def _run_one(store: Store, opts: RunOptions, prof: profiles.Profile, wl: workloads.Workload, model: str,
             extra: dict | None = None, warmup_s: float | None = None) -> RunResult:
    warmup = opts.warmup_s if warmup_s is None else warmup_s
    n_workers = max(1, opts.workers + opts.expect_workers)
    params = {k: v for k, v in prof.params.items() if not k.startswith("_")}
    config = {"target": opts.target, "model": model, "api_key_env": opts.api_key_env, "stream": opts.stream,
              "profile": {"name": prof.name, "type": prof.type, "params": params}, "workload": wl.to_dict(),
              "seed": opts.seed, "warmup_s": warmup, "workers": n_workers, "timeout_s": opts.timeout_s,
              "read_timeout_s": opts.read_timeout_s, "think_s": float(params.get("think_s", 0.0)),
              "slo": {k: v for k, v in vars(opts.slo).items() if v is not None}, "sessions": wl.closed_loop,
              **opts.request_shape, **({"gpu_metrics": list(opts.gpu_metrics)} if opts.gpu_metrics else {}),
              **opts.run_config, **(extra or {})}
    stages = None
    if prof.open_loop:
        offsets = sessions.arrivals(prof.arrivals(opts.seed, warmup), wl, "_offsets" in prof.params)
        total = len(offsets)
        last_offset = float(offsets[-1]) if total else 0.0
        # never more users than requests to send: spawning the pool is the wait before the first arrival
        pool = opts.max_inflight or int(min(4096, max(32, prof.peak_rate() * 20), max(total, 1)))
        cap = params.get("max_concurrency")
        if cap is not None:
            if cap < n_workers:
                raise BadInput(f"max_concurrency {cap} is below the {n_workers} load processes it is split over")
            pool = max(pool, cap + 32)  # users past the cap wait for a slot: the pool must outnumber it
        config.update(duration_s=last_offset, connections=pool // n_workers + 1)
    else:
        stages = [(int(s["users"]), float(s["duration"])) for s in params.get("stages") or []] or \
            [(int(prof.p("users")), float(prof.p("duration")))]
        if warmup > 0:
            stages.insert(0, (stages[0][0], warmup))
        total, pool = None, max(u for u, _ in stages)
        config.update(duration_s=sum(d for _, d in stages), connections=pool // n_workers + 1)
    run_id = store.start_run(label=opts.label, target=opts.run_config.get("twin", opts.target), profile=prof.name,
                             config={**config, "locust_workers": opts.workers, "expected_workers": n_workers})
    if not opts.quiet:
        print(f"capbench run {run_id}: {prof.name} against {opts.target}, into {store.path}", file=sys.stderr,
              flush=True)
    state = {"aborted": False, "t0": None}
    try:
        env, collector, written, sent = _drive(opts, prof, config, run_id, store, total, pool, stages, state)
    except BaseException as e:  # the run still ends in the DB: aborted on Ctrl-C, failed otherwise
        store.finish_run(run_id, "aborted" if isinstance(e, KeyboardInterrupt) or state["aborted"] else "failed")
        raise
    status = "aborted" if state["aborted"] else "completed"
    if written is None:  # the recorder failed: what is in the DB is what was stored
        return _failed_run(store, opts, run_id, env, collector, sent, state)
    store.finish_run(run_id, status)
    with store.connect() as con:
        summary = queries.summary(con, run_id, opts.slo)
        succeeded = con.execute("SELECT coalesce(sum(n), 0)::BIGINT FROM request_stats WHERE run_id = ? AND "
                                "status = 'ok'", [run_id]).fetchone()[0]
    summary.update(sent=sent, stored=written.get("requests", 0), succeeded=succeeded)
    stats = env.runner.stats.total
    if not opts.quiet:
        print_summary(summary, store=store, slo=opts.slo)
    return RunResult(run_id, status, summary, stats.num_requests, stats.num_failures, collector.records,
                     written.get("requests", 0), sent)


def _failed_run(store: Store, opts: RunOptions, run_id: str, env: Environment, collector: Collector, sent: int,
                state: dict) -> RunResult:
    """The recorder could not store the run (disk full, DB file gone or truncated): the run stopped sending;
    the rows stored are those the DB still has (or the recorder's count, if the DB cannot be read)."""
    stored = int(state.get("said", {}).get("requests") or 0)
    summary: dict = {}
    try:
        store.finish_run(run_id, "failed")
        with store.connect() as con:
            stored = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0]
            summary = queries.summary(con, run_id, opts.slo)
    except Exception:  # the DB itself is what failed: the recorder's count stands
        pass
    summary.update(sent=sent, stored=stored, succeeded=0, error=state.get("failed"))
    stats = env.runner.stats.total
    return RunResult(run_id, "failed", summary, stats.num_requests, stats.num_failures, collector.records, stored,
                     sent, error=state.get("failed"))


def _drive(opts: RunOptions, prof: profiles.Profile, config: dict, run_id: str, store: Store, total: int | None,
           pool: int, stages: list | None, state: dict) -> tuple[Environment, Collector, dict | None, int]:
    """Locust for one run, from the recorder's start to its last row; returns the environment, the collector,
    the recorder's row counts (None if it failed) and the requests sent."""
    distributed = opts.workers + opts.expect_workers > 0
    n_workers = config["workers"]
    params = config["profile"]["params"]
    # each local worker writes into a pipe of its own to the recorder: a master killed outright loses none of its rows
    pipes = [os.pipe() for _ in range(opts.workers)]
    try:
        recorder = Recorder(store.path, run_id, opts.target, feeds=tuple(r for r, _ in pipes),
                            gpu_metrics=opts.gpu_metrics, gpu_metrics_interval_s=opts.gpu_metrics_interval_s)
    finally:
        for r, _ in pipes:
            os.close(r)
    if opts.gpu_metrics:  # the GPU nodes' telemetry from the first request on, not from when the recorder got going
        recorder.wait_ready(60.0)
    collector = Collector(recorder)
    collector.inflight = (lambda: [r for recs in collector.inflight_by_worker.values() for r in recs]) if distributed \
        else (lambda: list(getattr(getattr(env, "capbench_plan", None), "inflight", {}).values()))

    env = Environment(user_classes=[OpenLoopUser if prof.open_loop else ClosedLoopUser], stop_timeout=0.0)
    if not distributed:
        env.capbench_on_sent = collector.started
        env.capbench_on_withdrawn = collector.withdrawn
    if distributed:
        port = opts.master_port if opts.expect_workers else local_workers.free_port()
        try:
            env.create_master_runner(opts.master_bind, port)
        except RPCError as e:
            raise BadInput(f"the Locust master cannot listen on {opts.master_bind}:{port} ({e})") from None
        env.runner.register_message(RECORDS_MSG, collector.on_message)
    else:
        env.create_local_runner()
    env.events.request.add_listener(collector.on_request)

    def sent_total() -> int:
        if distributed:
            return sum(collector.sent_by_worker.values())
        plan = getattr(env, "capbench_plan", None)
        return plan.sent if plan else 0

    def done(_run_time: float) -> bool:
        now = time.time()
        if state["aborted"] or (opts.gone is not None and opts.gone()):
            return True
        if now < state["t0"] + config["duration_s"]:
            return False
        if total is not None:  # every arrival's request, or every arrival's session, has ended
            settled = (collector.sessions_done if config["sessions"] else collector.records) >= total
        else:
            settled = collector.records >= sent_total()
        return settled or now > state["t0"] + config["duration_s"] + opts.drain_s or _all_late(now)

    def _all_late(now: float) -> bool:  # each measured request in flight already missed the TTFT bound
        if opts.late_after_s is None or total is None or sent_total() < total:
            return False
        return all((r.get("first_token_at") or now) - r["scheduled_at"] > opts.late_after_s
                   for r in collector.inflight() if r.get("phase") == "measured")

    if prof.open_loop:
        env.shape_class = profiles.PoolShape(pool, done)
    else:
        env.shape_class = profiles.StagesShape(stages, float(params.get("spawn_rate", max(pool, 1))))
        env.shape_class.extra_done = lambda after: done(0.0)
    env.shape_class.runner = env.runner

    try:
        procs = local_workers.spawn([w for _, w in pipes], env.runner.master_bind_port if distributed else 0)
    finally:
        for _, w in pipes:
            os.close(w)
    try:
        if distributed:
            local_workers.wait_for(env, n_workers, procs)
        # time to spawn the pool (about 10k users/s here; 2000/s counted) before the first request is due; a local
        # pool is spawned by the shape's first tick, a few milliseconds after start_shape
        lead = ((2.0 if distributed else 0.1) + pool / 2000 / n_workers) if prof.open_loop else 0.0
        state["t0"] = config["t0"] = time.time() + lead
        env.parsed_options = locust_options(config)
        _install_signals(env, state)
        env.runner.start_shape()
        live = Live(opts.live, prof, config, collector, env, sent_total)
        with live:
            flushed = time.monotonic()
            while True:
                gevent.sleep(POLL_S)
                if prof.open_loop and not distributed and done(0.0):
                    break  # every request accounted for: Locust's shape would see it only at its next tick (1 s)
                if time.monotonic() - flushed < FLUSH_S:
                    continue
                flushed = time.monotonic()
                collector.flush()
                live.update()
                if recorder.gone():  # nothing sent from here on could be stored: stop sending now
                    state["failed"] = recorder.failed
                    _stop_sending(env)
                    break
                if env.runner.state == "stopped" and env.runner.shape_greenlet is None:
                    break
                if time.time() > state["t0"] + config["duration_s"] + opts.drain_s + DRAIN_GRACE_S:
                    log.warning("the drain limit passed with requests in flight: stopping them")
                    env.runner.stop()  # in-flight requests end as `cancelled` records
                    break
        env.runner.quit()
        if distributed:  # free the port now: the next run (a sweep's next stage) binds it again
            env.runner.server.close(linger=0)
    finally:
        local_workers.reap(procs)
        collector.announce()
        collector.flush()
        written = recorder.close()
        if written is None:
            state.update(failed=recorder.failed or state.get("failed"), said=recorder.said)
    return env, collector, written, sent_total()


def _stop_sending(env: Environment) -> None:
    plan = getattr(env, "capbench_plan", None)
    if plan is not None:
        plan.stopping = True
    env.runner.stop()


def _install_signals(env: Environment, state: dict) -> None:
    def abort(*_):
        if not state["aborted"]:
            state["aborted"] = True
            plan = getattr(env, "capbench_plan", None)
            if plan is not None:
                plan.stopping = True
            print("\nstopping: the run will be marked aborted (everything measured so far is kept)",
                  file=sys.stderr)

    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, abort)
