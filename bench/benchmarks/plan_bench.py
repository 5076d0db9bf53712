"""How fast does `capbench plan` answer the README's first question? Wall time of the command, as a user runs it:

- previous: the full search of the code before issue 22 (--previous, a git revision, run from its own tree),
- full: today's search with every answer computed (no shipped answers, an empty cache),
- cold: a fresh clone's first run (the shipped answers, an empty cache of your own),
- warm: the same command again (your cache filled).

Each run's recommendation is printed too: they must be the same line.

    python -m bench.benchmarks.plan_bench [--rate 20] [--previous 1638ddf] [--skip-previous]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = "1638ddf"  # main before issue 22's caches


def _plan(rate: float, cache: str, shipped: bool, tree: Path | None = None) -> tuple[float, str]:
    env = {**os.environ, "CAPBENCH_CACHE": cache, "CAPBENCH_SHIPPED_CACHE": "1" if shipped else "0"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-c", "from bench.cli import main; main()", "plan", "--model", "kimi-k2-thinking",
           "--workload", "chat", "--rate", f"{rate:g}", "--slo", "ttft=2s,tpot=50ms,p=90", "--json"]
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree or ROOT, env=env, timeout=1800)
    wall = time.perf_counter() - t
    if out.returncode:
        sys.exit(f"capbench plan failed: {out.stderr[-1000:]}")
    rec = json.loads(out.stdout)["recommended"]
    return wall, f"{rec['config']}: {rec['rate_rps']:.4f} req/s per instance, ${rec['monthly_cost']:,.0f} a month"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0, help="target load (README: 20; issue 22: 50)")
    ap.add_argument("--previous", default=PREVIOUS, help="git revision whose full search is the baseline")
    ap.add_argument("--skip-previous", action="store_true")
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other work "
          f"running makes every figure slower)")
    print(f"capbench plan --model kimi-k2-thinking --workload chat --rate {a.rate:g} --slo ttft=2s,tpot=50ms,p=90")
    rows = []
    with tempfile.TemporaryDirectory(prefix="capbench-plan-bench-") as tmp:
        if not a.skip_previous:
            tree = Path(tmp) / "previous"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", a.previous], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            rows.append((f"previous ({a.previous}), full search", *_plan(a.rate, f"{tmp}/c0", False, tree)))
        rows.append(("today, full search (nothing cached)", *_plan(a.rate, f"{tmp}/c1", False)))
        rows.append(("cold (shipped answers, empty cache)", *_plan(a.rate, f"{tmp}/c2", True)))
        rows.append(("warm (the same command again)", *_plan(a.rate, f"{tmp}/c2", True)))
    for name, wall, rec in rows:
        print(f"{name:<42} {wall:7.1f} s   {rec}")
    if len({rec for *_, rec in rows}) != 1:
        sys.exit("the recommendations differ")


if __name__ == "__main__":
    main()
