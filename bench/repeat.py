"""`capbench run --repeat N [--until-ci FIGURE:WIDTH]`: the same load N times, each a run of its own in the store
(grouped by runs.config's repeat_group), then every figure of the summary with its 90 % Student t interval across
the runs; with --until-ci, it stops once that figure's interval is within the width (from MIN_RUNS runs on).

Each repeat draws its own schedule and prompts (seed, seed + 1, ...): the same prompts again would meet the
server's prefix cache from the run before, and the later runs would measure a warm cache the first did not.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from bench.errors import BadInput
from bench.runner import RunOptions, RunResult, run
from bench.store import Store, repeats, runinfo
from loadgen import profiles

MAX_REPEATS = 100
UNTIL_CI_RUNS = 10  # the most runs --until-ci makes when --repeat does not say


def run_repeated(opts: RunOptions, n: int, until: str | None = None) -> list[RunResult]:
    """Up to n runs of the load (n is the most when `until` is given); the results in the order they ran."""
    if not 1 <= n <= MAX_REPEATS:
        raise BadInput(f"--repeat must be from 1 to {MAX_REPEATS}, not {n}")
    goal = repeats.parse_until(until) if until else None
    if goal and n < repeats.MIN_RUNS:
        raise BadInput(f"--until-ci needs --repeat of at least {repeats.MIN_RUNS} (the most runs it may make)")
    try:
        if profiles.load(opts.profile, opts.overrides).type == "sweep":
            raise BadInput("--repeat runs one load point again; a sweep's stages are not repeated (run the sweep "
                           "several times, or a campaign load with repeats:)")
    except profiles.ProfileError as e:
        raise BadInput(str(e)) from None
    group = uuid.uuid4().hex[:12]
    err = Console(stderr=True)
    err.print(f"capbench run: repeat group {group}, up to {n} runs"
              + (f", until the 90 % interval of {goal[0]} is within {_width(goal)}" if goal else ""))
    results: list[RunResult] = []
    for i in range(n):
        label = f"{opts.label} #{i + 1}".strip()
        one = replace(opts, seed=opts.seed + i, label=label, quiet=True,
                      run_config={**opts.run_config, "repeat_group": group, "repeat": i})
        res = run(one)[-1]
        results.append(res)
        with Store(opts.db, read_only=True).connect() as con:  # a twin's in the modelled GPUs' time, as shown
            s = runinfo.summary(con, res.run_id, opts.slo) if res.status == "completed" else res.summary
            iv = repeats.intervals(con, [r.run_id for r in results], opts.slo).get(goal[0]) \
                if goal and i + 1 >= repeats.MIN_RUNS and res.status == "completed" else None
        err.print(f"repeat {i + 1}/{n}: run {res.run_id} {res.status}: {s.get('throughput_rps') or 0:.3g} req/s, "
                  f"{s.get('output_tps') or 0:.4g} tok/s, TTFT p50 {_ms(s.get('ttft_p50'))}")
        if res.status != "completed":
            break
        if goal and iv is not None:
            if repeats.within(iv, goal[1], goal[2]):
                err.print(f"stopping after {i + 1} runs: {goal[0]} {iv['mean']:.4g} +/- {iv['half']:.3g} (90 %), "
                          f"within {_width(goal)}")
                break
    done = [r.run_id for r in results if r.status == "completed"]
    if len(done) >= 2:
        with Store(opts.db, read_only=True).connect() as con:
            scale = runinfo.time_scale(con, done[0])
            table = interval_table(repeats.intervals(con, done, opts.slo), f"repeat group {group}: {len(done)} runs"
                                   + (f", {runinfo.clock(scale, True)}" if scale != 1 else ""))
        Console().print(table)
    elif n > 1:
        print(f"repeat group {group}: fewer than two completed runs, no interval", file=sys.stderr)
    return results


def interval_table(ivs: dict[str, dict], title: str) -> Table:
    """One row per figure: mean, 90 % interval, half-width (and its share of the mean), each run's value."""
    t = Table(title=f"{title} (mean and 90 % Student t interval)")
    for col in ("figure", "mean", "90 % interval", "+/-", "runs"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for figure, iv in ivs.items():
        fmt = _ms if figure.endswith(("_p50", "_p90", "_p99")) else _num
        share = f" ({iv['half'] / abs(iv['mean']):.1%})" if iv["mean"] else ""
        t.add_row(figure, fmt(iv["mean"]), f"{fmt(iv['low'])} .. {fmt(iv['high'])}", fmt(iv["half"]) + share,
                  ", ".join(fmt(v) for v in iv["values"]))
    return t


def _width(goal: tuple[str, float, bool]) -> str:
    return f"{goal[1]:.1%} of its mean" if goal[2] else f"{goal[1]:g}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
