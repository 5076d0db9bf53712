"""How fast is `capbench simulate`? Wall time to simulate 10,000 chat requests (1,000 of each long mix) with
Kimi K2 Thinking on 8x H200 (BF16 KV) at a rate near each mix's capacity, median of --repeat runs, and
simulated requests per wall second. Goal: 10,000 chat requests in a few seconds.

    python -m bench.benchmarks.simulate_bench [--requests 10000] [--repeat 3]
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
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
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
