"""Repeated runs of one load (`capbench run --repeat N`): a repeat group's runs (runs.config's repeat_group) and a
Student t interval on each figure of their summaries, in the time of the GPUs they measured or modelled
(runinfo.summary), as every page shows a run."""

from __future__ import annotations

import math

import duckdb

from bench.errors import BadInput
from bench.model import Slo
from bench.store import runinfo

LEVEL = 0.90
FIGURES = ("throughput_rps", "output_tps", "goodput_rps", "slo_attainment", "success_rate", "achieved_rate_rps",
           *(f"{m}_p{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)))
ALIASES = {"tok_s": "output_tps", "req_s": "throughput_rps", "rps": "throughput_rps", "goodput": "goodput_rps",
           "ttft": "ttft_p50", "tpot": "tpot_p50", "itl": "itl_p50", "e2e": "e2e_p50"}
MIN_RUNS = 3  # --until-ci judges an interval from this many runs on (two give a t factor of 6.3: rarely tight)


def interval(values: list[float | None], level: float = LEVEL) -> dict | None:
    """{mean, half, low, high, n}: the Student t interval of the mean of the finite values; None under two."""
    from scipy import stats

    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n < 2:
        return None
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "half": half, "low": mean - half, "high": mean + half, "n": n}


def parse_until(text: str) -> tuple[str, float, bool]:
    """--until-ci FIELD:WIDTH -> (summary figure, width, relative): `tok_s:5%` is output_tps within 5 % of its
    mean; `ttft_p99:0.02` within 0.02 of its own unit (seconds)."""
    name, sep, width = text.partition(":")
    figure = ALIASES.get(name.strip(), name.strip())
    if not sep or figure not in FIGURES:
        raise BadInput(f"--until-ci takes FIGURE:WIDTH (e.g. tok_s:5%), FIGURE one of "
                       f"{', '.join([*ALIASES, *FIGURES])}; not {text!r}")
    relative = width.strip().endswith("%")
    try:
        value = float(width.strip().rstrip("%"))
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise BadInput(f"--until-ci {text!r}: the width is a positive number, or a percentage of the mean (5%)")
    return figure, value / 100 if relative else value, relative


def within(iv: dict | None, width: float, relative: bool) -> bool:
    """Whether the interval's half-width is within `width` (of its mean, when relative)."""
    if iv is None:
        return False
    return iv["half"] <= (width * abs(iv["mean"]) if relative else width)


def group_of(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    row = con.execute("SELECT json_extract_string(config, '$.repeat_group') FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    return row[0] if row else None


def group_runs(con: duckdb.DuckDBPyConnection, group: str) -> list[str]:
    """The group's completed runs, oldest first."""
    return [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE json_extract_string(config, '$.repeat_group') = ? AND status = 'completed' "
        "ORDER BY started_at", [group]).fetchall()]


def intervals(con: duckdb.DuckDBPyConnection, run_ids: list[str], slo: Slo | None = None) -> dict[str, dict]:
    """Each figure's interval over the runs (figures with fewer than two values left out)."""
    sums = [runinfo.summary(con, r, slo) for r in run_ids]
    out = {}
    for f in FIGURES:
        iv = interval([s.get(f) for s in sums])
        if iv is not None:
            out[f] = {**iv, "values": [s.get(f) for s in sums]}
    return out
