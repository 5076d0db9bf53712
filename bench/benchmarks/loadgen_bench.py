"""How fast is the load generator itself? Against a zero-delay SSE server in its own process (sse_server.py):

1. the most streamed requests/s one load-generator process sustains (closed loop, many users, 8 tokens a
   response, every record built and fired through Locust's request event exactly as in a real run);
2. dispatch lag (sent - due) percentiles of an open-loop Poisson schedule at 500 req/s.

Goals: >= 3000 streamed req/s; lag p99 < 2 ms at 500 req/s. Also printed: the client's CPU seconds per second
(a figure of 1.0 means the client used one whole core: the client, not the server, was the limit) and the
machine's load average, because on a shared machine the figures move with the neighbours' load.

    python -m bench.benchmarks.loadgen_bench [--duration 10] [--users 64] [--rate 500]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import gevent
import numpy as np
from locust.env import Environment

from loadgen import workloads
from loadgen.users import ClosedLoopUser, OpenLoopUser, wait_until
from loadgen.worker import locust_options

ROOT = Path(__file__).resolve().parents[2]


def start_server(tokens: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "bench.benchmarks.sse_server", "--tokens", str(tokens)],
                            stdout=subprocess.PIPE, cwd=ROOT, text=True)
    port = json.loads(proc.stdout.readline())["port"]
    return proc, f"http://127.0.0.1:{port}"


def config(url: str, profile: dict, duration: float, users: int, tokens: int) -> dict:
    wl = workloads.from_dict({"name": "bench", "input": 64, "output": tokens})
    return {"target": url, "model": "stub-model", "stream": True, "profile": profile, "workload": wl.to_dict(),
            "seed": 1, "warmup_s": 0.0, "workers": 1, "t0": time.time() + 1.0, "duration_s": duration,
            "connections": users + 1, "timeout_s": 30.0}


def drive(user_class, cfg: dict, users: int, settle_s: float) -> tuple[list[dict], float, float]:
    """Run users until the config's duration is over; returns the records, wall seconds, client CPU seconds."""
    env = Environment(user_classes=[user_class], parsed_options=locust_options(cfg), stop_timeout=0.0)
    env.create_local_runner()
    records: list[dict] = []
    env.events.request.add_listener(lambda context=None, **kw: records.append(context["capbench"]))
    env.runner.start(users, spawn_rate=users)
    gevent.sleep(max(0.0, cfg["t0"] - time.time()))
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    gevent.sleep(cfg["duration_s"] + settle_s)
    cpu1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    env.runner.quit()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    drive.kernel_share = (cpu1.ru_stime - cpu0.ru_stime) / max(cpu, 1e-9)
    return records, wall, cpu


def throughput(url: str, duration: float, users: int, tokens: int) -> dict:
    cfg = config(url, {"name": "users", "type": "users", "params": {"users": users, "duration": duration}},
                 duration, users, tokens)
    records, wall, cpu = drive(ClosedLoopUser, cfg, users, 0.0)
    t0, t1 = cfg["t0"], cfg["t0"] + duration
    ok = [r for r in records if r["status"] == "ok" and t0 <= r["finished_at"] <= t1]
    bad = [r for r in records if r["status"] != "ok" and r["error_kind"] != "aborted"]
    return {"streamed_rps": len(ok) / duration, "errors": len(bad), "client_cpu_per_s": cpu / wall,
            "rps_per_client_core": len(ok) / duration / max(cpu / wall, 1e-9), "kernel_share": drive.kernel_share,
            "tokens_per_response": tokens, "users": users}


def lag(url: str, rate: float, duration: float, tokens: int) -> dict:
    profile = {"name": "poisson", "type": "poisson", "params": {"rate": rate, "duration": duration}}
    pool = int(rate * 2)
    records, wall, cpu = drive(OpenLoopUser, config(url, profile, duration, pool, tokens), pool, 1.0)
    lags = np.array([r["dispatch_lag_s"] for r in records]) * 1000
    p50, p90, p99, p999 = np.percentile(lags, [50, 90, 99, 99.9])
    return {"rate": rate, "requests": len(lags), "lag_p50_ms": p50, "lag_p90_ms": p90, "lag_p99_ms": p99,
            "lag_p99.9_ms": p999, "lag_max_ms": lags.max(),
            "errors": sum(r["status"] != "ok" for r in records), "client_cpu_per_s": cpu / wall}


def timer_floor(rate: float, seconds: float = 3.0) -> np.ndarray:
    """The machine's own floor: how late the users' wait (wait_until) ends at the same rate with no HTTP (ms)."""
    late: list[float] = []

    def one(due: float) -> None:
        wait_until(due)
        late.append(time.time() - due)

    t0 = time.time() + 0.2
    gaps = np.random.default_rng(0).exponential(1 / rate, int(rate * seconds))
    greenlets = [gevent.spawn(one, t0 + t) for t in np.cumsum(gaps)]
    gevent.joinall(greenlets)
    return np.array(late) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="throughput runs; the median is the figure")
    a = ap.parse_args()
    server, url = start_server(a.tokens)
    try:
        runs = [throughput(url, a.duration, a.users, a.tokens) for _ in range(a.repeat)]
        best = sorted(runs, key=lambda r: r["streamed_rps"])[len(runs) // 2]
        floor = timer_floor(a.rate)
        lg = lag(url, a.rate, a.duration, a.tokens)
    finally:
        server.terminate()
        server.wait()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"streamed req/s, one process, {a.users} users, {a.tokens} tokens a response, median of {a.repeat}: "
          f"{best['streamed_rps']:.0f}  (runs: {', '.join(format(r['streamed_rps'], '.0f') for r in runs)}; "
          f"client CPU {best['client_cpu_per_s']:.2f} s/s ({best['kernel_share']:.0%} in the kernel), "
          f"{best['rps_per_client_core']:.0f} req/s per client core; "
          f"errors {best['errors']})  goal >= 3000: {'met' if best['streamed_rps'] >= 3000 else 'MISSED'}")
    print(f"dispatch lag at {lg['rate']:.0f} req/s Poisson, {lg['requests']} requests: p50 {lg['lag_p50_ms']:.3f} ms, "
          f"p90 {lg['lag_p90_ms']:.3f} ms, p99 {lg['lag_p99_ms']:.3f} ms, p99.9 {lg['lag_p99.9_ms']:.3f} ms, "
          f"max {lg['lag_max_ms']:.3f} ms (errors {lg['errors']}; client CPU {lg['client_cpu_per_s']:.2f} s/s)  "
          f"goal p99 < 2 ms: "
          f"{'met' if lg['lag_p99_ms'] < 2 else 'MISSED'}")
    print(f"timer floor (gevent timers at {a.rate:.0f}/s, no HTTP, same process): "
          f"p50 {np.percentile(floor, 50):.3f} ms, p99 {np.percentile(floor, 99):.3f} ms, max {floor.max():.3f} ms")


if __name__ == "__main__":
    main()
