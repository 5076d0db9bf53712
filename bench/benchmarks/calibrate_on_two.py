"""Does calibrating on your own runs narrow the error? Checked on the corpus: for each published deployment with four
or more runs (same source, model, GPU, parallelism, weights, KV dtype, MTP), calibrate on two of them (the lowest and
the highest concurrency) with `capbench calibrate`'s fit (bench/calibrate.py: bounded robust least squares on the
GPU's factors), and predict the others. The starting factors are the corpus fit made without that source (leave one
source out), so neither the before nor the after has seen the runs it predicts.

    python -m bench.benchmarks.calibrate_on_two [--json OUT] [--max-nfev 15]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

from bench import calibrate as cal
from bench.model import corpus, fit, validate

FIGURES = ("output_tok_s", "tpot_ms", "ttft_ms")


def groups(min_runs: int = 4) -> dict[tuple, list]:
    by: dict[tuple, list] = {}
    for c in corpus.load():
        if fit.in_goal(c) is None and c.kind == "throughput" and c.workload and c.published:
            key = (c.source.id, c.model, c.gpu, c.tp, c.dp, c.ep, c.weights, c.kv_dtype, c.mtp)
            by.setdefault(key, []).append(c)
    return {k: v for k, v in by.items() if len(v) >= min_runs}


def _load(c) -> float:
    w = c.workload
    return float(w.max_concurrency or (w.request_rate if w.request_rate not in (None, math.inf) else w.num_prompts))


def split(cases: list) -> tuple[list, list]:
    ordered = sorted(cases, key=lambda c: (_load(c), c.id))
    return [ordered[0], ordered[-1]], ordered[1:-1]


def _vector(replays: list) -> np.ndarray:
    return np.array([math.log1p(r.errors[f]) if f in r.errors else 0.0 for r in replays for f in FIGURES])


def check(key: tuple, cases: list, scales: dict, default: dict, max_nfev: int) -> dict:
    train, test = split(cases)
    gpu = cases[0].gpu
    start = fit.scaled(gpu, scales.get(cases[0].source.org, default))
    result = cal.least_squares_fit(lambda eff: _vector([validate.replay(c, eff) for c in train]), start,
                                   cal.fitted_factors(gpu), starts=(1.0,), max_nfev=max_nfev)
    before = [validate.replay(c, start) for c in test]
    after = [validate.replay(c, result.eff) for c in test]
    out = {"deployment": " ".join(str(k) for k in key), "train": [c.id for c in train], "test": len(test),
           "factors": {n: getattr(result.eff, n) for n in result.factors},
           "uncertainty": result.uncertainty}
    for name, reps in (("before", before), ("after", after)):
        out[name] = {f: [abs(r.errors[f]) for r in reps if f in r.errors] for f in FIGURES}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the per-deployment figures here")
    p.add_argument("--max-nfev", type=int, default=15, help="function evaluations of the fit per deployment")
    a = p.parse_args(argv)
    stored = fit.stored_validation() or {}
    scales = stored.get("out_of_sample", {}).get("scales_by_left_out_org", {})
    default = json.loads(fit.CORPUS_CALIBRATION.read_text())["scale"]
    rows, t0 = [], time.perf_counter()
    for key, cases in sorted(groups().items()):
        r = check(key, cases, scales, default, a.max_nfev)
        rows.append(r)
        med = {n: {f: statistics.median(v) if v else math.nan for f, v in r[n].items()} for n in ("before", "after")}
        print(f"{r['deployment']}: {r['test']} runs predicted; " + ", ".join(
            f"{f} {med['before'][f]:.0%} -> {med['after'][f]:.0%}" for f in FIGURES), flush=True)
    for f in FIGURES:
        b = [e for r in rows for e in r["before"][f]]
        af = [e for r in rows for e in r["after"][f]]
        if b:
            print(f"all: {f} median |error| {statistics.median(b):.1%} -> {statistics.median(af):.1%} over "
                  f"{len(af)} runs ({sum(x > y for x, y in zip(af, b, strict=True))} worse after)")
    print(f"{len(rows)} deployments, {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
