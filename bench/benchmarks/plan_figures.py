"""Every option's figures of one cold plan, as JSON, with the search's wall and CPU time: run it on two trees and
`cmp` the files to show that a change to the search moved no figure (configuration, screen throughput, predicted
rate / TTFT / TPOT / E2E, why rejected, which is recommended).

    python -m bench.benchmarks.plan_figures kimi-k2-thinking agentic-coding 5 out.json --slo ttft=5s,tpot=60ms
    PYTHONPATH=/tmp/before python -m bench.benchmarks.plan_figures ... before.json   (a `git archive` of the other tree)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import bench
from bench.model import Question, make_plan, parse_slo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("workload")
    ap.add_argument("rate", type=float, help="target load, requests/s")
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--slo", default="ttft=2s,tpot=50ms,p=90")
    ap.add_argument("--workers", type=int, default=1, help="processes (the figures do not depend on it)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="capbench-plan-figures-") as cache:
        os.environ["CAPBENCH_CACHE"], os.environ["CAPBENCH_SHIPPED_CACHE"] = cache, "0"  # cold: nothing cached
        q = Question(model=a.model, workload=a.workload, target_rate_rps=a.rate, slo=parse_slo(a.slo))
        t, before = time.perf_counter(), os.times()
        plan = make_plan(q, workers=a.workers)
        wall, after = time.perf_counter() - t, os.times()
    rows = []
    for o in plan.options:
        p = o.prediction
        rows.append([str(o.config), o.saturation_tps, None if p is None else [p.rate_rps, p.ttft_s, p.tpot_s, p.e2e_s],
                     o.rejected_because, o.recommended])
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=0, default=str)
    cpu = after.user + after.children_user - before.user - before.children_user
    print(f"{bench.__file__}: wall {wall:.1f} s, CPU {cpu:.1f} s, {len(rows)} options, "
          f"{sum(r[2] is not None for r in rows)} simulated; recommended: {[r[0] for r in rows if r[4]]}")


if __name__ == "__main__":
    main()
