"""The corpus out of sample, before and after the kernel tables: each organisation's cases replayed with the factors
fitted without it (validation.json's scales_by_left_out_org, as `capbench validate --rescore` does), once with the
roofline (CAPBENCH_PERF=roofline) and once with the kernel tables, overall and per regime (GPU family x attention x
expert format x load), with the 80 % intervals' leave-one-source-out coverage.

    python -m bench.benchmarks.kernel_validate [--json OUT] [--markdown]
    python -m bench.benchmarks.kernel_validate --by-version   # the stored out-of-sample errors by publisher x version
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

from bench.model import corpus, fit, interval, validate

FIGURES, Replay, error_summary, replay = validate.FIGURES, validate.Replay, validate.error_summary, validate.replay


def _run(cases: list, by_org: dict, default: dict, roofline: bool) -> list:
    if roofline:
        os.environ["CAPBENCH_PERF"] = "roofline"
    else:
        os.environ.pop("CAPBENCH_PERF", None)
    return [replay(c, fit.scaled(c.gpu, by_org.get(c.source.org, default))) for c in cases]


def _rows(replays: list) -> list[interval.Row]:
    return [interval.Row(r.case.key, r.case.source.org, interval.case_regime(r.case),
                         {f: -math.log1p(e) for f, e in r.errors.items()}) for r in replays if r.errors]


def _regimes(replays: list) -> dict[str, dict]:
    by: dict[str, list] = {}
    for r in replays:
        if r.errors:
            by.setdefault(interval.case_regime(r.case).label(), []).append(r)
    return {k: error_summary(v) for k, v in sorted(by.items())}


def measure(only_after: bool = False) -> dict:
    stored = fit.stored_validation()
    if not stored:
        raise SystemExit("no validation.json: run `capbench validate --fit` once")
    by_org = stored["out_of_sample"]["scales_by_left_out_org"]
    default = json.loads(fit.CORPUS_CALIBRATION.read_text())["scale"]
    cases = [c for c in corpus.load() if fit.in_goal(c) is None and c.kind == "throughput"]
    out = {}
    runs = (("before (roofline)", True), ("after (kernel tables)", False))
    for name, roofline in runs[1:] if only_after else runs:
        t0 = time.perf_counter()
        replays = _run(cases, by_org, default, roofline)
        cov = interval.coverage(_rows(replays))
        out[name] = {"summary": error_summary(replays), "regimes": _regimes(replays),
                     "coverage": {f: cov[f]["coverage"] for f in cov}, "seconds": time.perf_counter() - t0,
                     "cases": {r.case.key: r.errors for r in replays}}
    return out


def by_version() -> str:
    """validation.json's out-of-sample errors grouped by SGLang version, organisation and GPU (fit.out_of_sample_bias,
    no replay): the median predicted/published per figure, and which versions more than one organisation published."""
    rows = fit.out_of_sample_bias(("version", "org", "gpu"))
    if not rows:
        raise SystemExit("no validation.json: run `capbench validate --fit` once")
    head = " | ".join(f"{f} predicted/published" for f in FIGURES)
    lines = [f"| SGLang version | organisation | GPU | cases | {head} |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in FIGURES) + " |"]
    for r in sorted(rows, key=lambda r: (r["version"], r["org"], r["gpu"])):
        lines.append(f"| {r['version'][:40]} | {r['org']} | {r['gpu']} | {r['cases']} | " +
                     " | ".join(f"{r['ratio'][f]:.2f}" if f in r["ratio"] else "-" for f in FIGURES) + " |")
    orgs: dict[str, set[str]] = {}
    for r in rows:
        orgs.setdefault(r["version"], set()).add(r["org"])
    shared = sorted(v for v, o in orgs.items() if len(o) > 1)
    lines.append(f"\nVersions published by more than one organisation: {', '.join(shared) or 'none'} "
                 f"(of {len(orgs)} versions).")
    return "\n".join(lines)


def markdown(res: dict) -> str:
    names = list(res)
    lines = ["| regime | figure | cases | " + " | ".join(f"{n}: median, beyond 1.5x" for n in names) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]

    def cells(summaries: list[dict], fig: str) -> list[str]:
        return [f"{s[fig]['median_abs_error']:.0%}, {s[fig]['beyond_1_5x']}" if fig in s else "-" for s in summaries]

    for fig in FIGURES:
        s = [res[n]["summary"] for n in names]
        if fig in s[0]:
            lines.append(f"| all | {fig} | {s[0][fig]['cases']} | " + " | ".join(cells(s, fig)) + " |")
    lines.append("| all | 80 % coverage | | " + " | ".join(
        ", ".join(f"{f} {res[n]['coverage'].get(f, float('nan')):.0%}" for f in FIGURES) for n in names) + " |")
    for reg in sorted(set().union(*(res[n]["regimes"] for n in names))):
        for fig in FIGURES:
            s = [res[n]["regimes"].get(reg, {}) for n in names]
            if fig in s[0]:
                lines.append(f"| {reg} | {fig} | {s[0][fig]['cases']} | " + " | ".join(cells(s, fig)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the figures (and per-case errors) to this file")
    p.add_argument("--markdown", action="store_true", help="print the per-regime table as Markdown")
    p.add_argument("--only-after", action="store_true", help="the kernel tables' pass only")
    p.add_argument("--by-version", action="store_true",
                   help="print the stored out-of-sample errors by SGLang version, organisation and GPU, and stop")
    a = p.parse_args(argv)
    if a.by_version:
        print(by_version())
        return 0
    res = measure(a.only_after)
    for name, r in res.items():
        print(f"{name}: {r['seconds']:.0f} s")
        for fig, s in r["summary"].items():
            print(f"  {fig}: {s['cases']} cases, median |error| {s['median_abs_error']:.1%}, "
                  f"{s['beyond_1_5x']} beyond 1.5x, 80 % coverage {r['coverage'].get(fig, float('nan')):.0%}")
    if a.markdown:
        print(markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.only_after:
        return 0
    worse = [k for k in res["after (kernel tables)"]["cases"]
             if statistics.fmean(abs(e) for e in res["after (kernel tables)"]["cases"][k].values() or [0]) >
             statistics.fmean(abs(e) for e in res["before (roofline)"]["cases"].get(k, {}).values() or [0])]
    print(f"{len(worse)} cases worse after (mean |error| over their figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
