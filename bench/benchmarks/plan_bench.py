"""How fast does `capbench plan` answer the README's first question? Wall time of the command, as a user runs it:

- previous: the full search of the code before issue 22 (--previous, a git revision, run from its own tree),
- full: today's search with every answer computed (no shipped answers, an empty cache),
- cold: a fresh clone's first run (the shipped answers, an empty cache of your own),
- warm: the same command again (your cache filled).

Each run's recommendation is printed too: they must be the same line.

--cold-questions times instead four questions outside the shipped answers (COLD_QUESTIONS: chat on GLM-4.6 and
Kimi K2 Thinking, Kimi agentic coding, and the README's second tour command, 32k-token prompts on H200 and B200),
each a fresh process with an empty cache of its own and the shipped answers switched off: what a user waits for a
question nobody asked before.

    python -m bench.benchmarks.plan_bench [--rate 20] [--previous 1638ddf] [--skip-previous] [--planner]
    python -m bench.benchmarks.plan_bench --cold-questions [--against main]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = "1638ddf"  # main before issue 22's caches
# `capbench plan` arguments: none of these questions is in data/plan-cache
COLD_QUESTIONS = (("--model", "glm-4.6", "--workload", "chat", "--rate", "13", "--slo", "ttft=2s,tpot=50ms,p=90"),
                  ("--model", "kimi-k2-thinking", "--workload", "chat", "--rate", "20", "--slo",
                   "ttft=2s,tpot=50ms,p=90"),
                  ("--model", "kimi-k2-thinking", "--workload", "agentic-coding", "--rate", "5", "--slo",
                   "ttft=5s,tpot=60ms"),
                  ("--model", "glm-4.6", "--input-len", "32000", "--output-len", "1000", "--rate", "2", "--gpus",
                   "h200,b200", "--price", "3.10"))


def _readme(rate: float) -> tuple[str, ...]:
    """The README's first question at `rate` req/s."""
    return "--model", "kimi-k2-thinking", "--workload", "chat", "--rate", f"{rate:g}", "--slo", "ttft=2s,tpot=50ms,p=90"


def _plan(args: tuple[str, ...], cache: str, shipped: bool, tree: Path | None = None) -> tuple[float, float, str]:
    env = {**os.environ, "CAPBENCH_CACHE": cache, "CAPBENCH_SHIPPED_CACHE": "1" if shipped else "0"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-c", "from bench.cli import main; main()", "plan", *args, "--json"]
    t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree or ROOT, env=env, timeout=1800)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # the command and its workers
    if out.returncode:
        sys.exit(f"capbench plan failed: {out.stderr[-1000:]}")
    rec = json.loads(out.stdout)["recommended"]
    return wall, cpu, f"{rec['config']}: {rec['rate_rps']:.4f} req/s per instance, ${rec['monthly_cost']:,.0f} a month"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0, help="target load (README: 20; issue 22: 50)")
    ap.add_argument("--previous", default=PREVIOUS, help="git revision whose full search is the baseline")
    ap.add_argument("--skip-previous", action="store_true")
    ap.add_argument("--planner", action="store_true", help="time the Planner page too (Streamlit AppTest)")
    ap.add_argument("--cold-questions", action="store_true",
                    help="time three questions outside the shipped answers, each cold (empty cache, none shipped)")
    ap.add_argument("--against", help="with --cold-questions: time each question on this git revision's tree too")
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other work "
          f"running makes every figure slower)")
    if a.cold_questions:
        _cold_questions(a.against)
        return
    print("capbench plan " + " ".join(_readme(a.rate)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="capbench-plan-bench-") as tmp:
        if not a.skip_previous:
            tree = Path(tmp) / "previous"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", a.previous], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            rows.append((f"previous ({a.previous}), full search", *_plan(_readme(a.rate), f"{tmp}/c0", False, tree)))
        rows.append(("today, full search (nothing cached)", *_plan(_readme(a.rate), f"{tmp}/c1", False)))
        rows.append(("cold (shipped answers, empty cache)", *_plan(_readme(a.rate), f"{tmp}/c2", True)))
        rows.append(("warm (the same command again)", *_plan(_readme(a.rate), f"{tmp}/c2", True)))
    print(f"{'':<42} {'wall':>8} {'CPU':>8}   (CPU: user + system of the command and its workers; on a busy "
          "machine wall time waits for a core)")
    for name, wall, cpu, rec in rows:
        print(f"{name:<42} {wall:7.1f}s {cpu:7.1f}s   {rec}")
    if len({rec for *_, rec in rows}) != 1:
        sys.exit("the recommendations differ")
    if a.planner:
        _planner()


def _cold_questions(against: str | None) -> None:
    """Each question of COLD_QUESTIONS in its own process, with an empty cache and no shipped answers; with
    `against`, on that revision's tree first (the same question, the same load, back to back)."""
    print(f"{'capbench plan (cold: empty cache, CAPBENCH_SHIPPED_CACHE=0)':<72} {'wall':>8} {'CPU':>8}   recommended")
    with tempfile.TemporaryDirectory(prefix="capbench-plan-bench-") as tmp:
        trees: list[tuple[str, Path | None]] = [("today", None)]
        if against:
            tree = Path(tmp) / "against"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", against], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            trees.insert(0, (against, tree))
        for i, args in enumerate(COLD_QUESTIONS):
            for name, tree in trees:
                wall, cpu, rec = _plan(args, f"{tmp}/c{i}{name}", False, tree)
                what = f"{name}: {' '.join(args)}"
                print(f"{what:<72} {wall:7.1f}s {cpu:7.1f}s   {rec}", flush=True)


def _planner() -> None:
    """The Planner page in Streamlit's AppTest (no browser): its defaults, a rerun, then the model changed."""
    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory(prefix="capbench-plan-bench-") as tmp:
        os.environ["CAPBENCH_CACHE"] = tmp  # a fresh clone's: the shipped answers only
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "planner.py"), default_timeout=1800)
        for name, change in (("defaults, cold (shipped answers)", None), ("defaults again (warm)", None),
                             ("model changed to glm-4.6", ("model", "glm-4.6")),
                             ("target load changed to 40 req/s", ("target_rate", 40.0))):
            if change and change[0] == "model":
                at.selectbox(key="model").set_value(change[1])
            elif change:
                at.number_input(key=change[0]).set_value(change[1])
            t, cpu = time.perf_counter(), _cpu()
            at.run()
            if at.exception:
                sys.exit(f"the Planner failed: {at.exception[0].value}")
            print(f"Planner page, {name:<36} {time.perf_counter() - t:7.1f}s {_cpu() - cpu:7.1f}s   "
                  f"{at.success[0].value[:80]}")


def _cpu() -> float:
    """CPU seconds of this process and its reaped workers."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main()
