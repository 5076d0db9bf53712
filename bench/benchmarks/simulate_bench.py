"""How fast is `capbench simulate`? Wall time to simulate 10,000 chat requests (1,000 of each long mix) with
Kimi K2 Thinking on 8x H200 (BF16 KV) at a rate near each mix's capacity, median of --repeat runs, and
simulated requests per wall second. Goal: 10,000 chat requests in a few seconds.

--search-horizon times instead what a cold agentic plan waits on: one simulation at the rate search's last horizon
(3,200 requests over at least 960 s) of Kimi K2 Thinking agentic coding on B200 tp4 ep4 with FP8 KV, near its
answer (0.7 req/s: the prefix cache full, decode spans evict) and past it (1.6 req/s: a queue that waits for room).

    python -m bench.benchmarks.simulate_bench [--requests 10000] [--repeat 3] [--search-horizon]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.model import Deployment, catalog, load_workload, simulate

RATES = {"chat": 8.0, "agentic-coding": 0.15, "long-context": 0.1}  # near each mix's capacity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", default="chat,agentic-coding,long-context")
    ap.add_argument("--search-horizon", action="store_true", help="the agentic search's last-horizon simulations")
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.search_horizon:
        dep = Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("b200"), 4, ep=4, kv_dtype="fp8_e4m3")
        for rate in (0.7, 1.6):
            walls = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                p = simulate.run(dep, load_workload("agentic-coding"), rate, 3200, min_seconds=960)
                walls.append(time.perf_counter() - t)
            print(f"agentic coding, B200 tp4 ep4 FP8 KV, 3,200 requests at {rate:g} req/s: "
                  f"{statistics.median(walls):.2f} s wall (median of {a.repeat}; TTFT p90 {p.ttft_p90:.2f} s, "
                  f"TPOT p90 {p.tpot_p90 * 1e3:.1f} ms, {p.output_tok_s:.1f} output tok/s)")
        return
    dep = Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8)
    for name in a.workloads.split(","):
        wl, rate = load_workload(name), RATES.get(name, 1.0)
        n = a.requests if name == "chat" else a.requests // 10
        walls = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            p = simulate.run(dep, wl, rate, n, min_seconds=0)
            walls.append(time.perf_counter() - t)
        wall = statistics.median(walls)
        print(f"{name}: {n:,} requests at {rate:g} req/s simulated in {wall:.2f} s wall (median of {a.repeat}; "
              f"{n / wall:,.0f} requests per second; simulated {n / rate / 60:.0f} min; TTFT p90 "
              f"{p.ttft_p90:.2f} s, TPOT p90 {p.tpot_p90 * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
