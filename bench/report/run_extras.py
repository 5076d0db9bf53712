"""The report's tables of what a run carried beside its requests: each GPU's utilisation and memory (NVML on the
load generator's machine, or a GPU node's DCGM exporter), and, for runs of a repeat group (`capbench run
--repeat N`), the group's figures with their 90 % intervals across its runs."""

from __future__ import annotations

import duckdb

from bench.model import Slo
from bench.store import queries, repeats, runinfo

Table = tuple[list[str], list[list[str]]]
SHOWN = (("throughput_rps", "req/s", 1.0, ".3g"), ("output_tps", "output tokens/s", 1.0, ",.4g"),
         ("ttft_p50", "TTFT p50", 1e3, ",.0f"), ("tpot_p50", "TPOT p50", 1e3, ",.1f"),
         ("e2e_p99", "E2E p99", 1e3, ",.0f"))


def tables(con: duckdb.DuckDBPyConnection, runs: list, slo: Slo | None = None) -> dict[str, Table]:
    """{"gpu_nodes": ..., "repeats": ...} for the report's measured runs (content.Measured), each only if it has
    rows."""
    out: dict[str, Table] = {}
    gpus = []
    for m in runs:
        for r in queries.gpu_summary(con, m.run_id).itertuples():
            total = "" if r.mem_total_mib != r.mem_total_mib else f" of {r.mem_total_mib / 1024:,.1f}"
            used = f"{_f(r.mem_used_mean_mib, ',.1f', 1024)} / {_f(r.mem_used_max_mib, ',.1f', 1024)}"
            gpus.append([m.label, r.node if isinstance(r.node, str) else "load generator (NVML)", str(r.gpu),
                         str(r.name or "-"), f"{_f(r.gpu_util_mean, '.0f')} / {_f(r.gpu_util_max, '.0f')} %",
                         f"{used}{total} GiB"])
    if gpus:
        out["gpu_nodes"] = (["run", "node", "GPU", "name", "utilisation mean / max", "memory used mean / max"], gpus)
    groups: dict[str, list] = {}
    for m in runs:
        if (g := repeats.group_of(con, m.run_id)) is not None:
            groups.setdefault(g, []).append(m)
    rows = []
    for g, members in groups.items():
        done = repeats.group_runs(con, g)
        ivs = repeats.intervals(con, done, slo)
        if not ivs:
            continue
        scale = runinfo.time_scale(con, done[0])
        rows.append([f"{members[0].short.rsplit(' (', 1)[0]} (group {g}{', modelled time' if scale != 1 else ''})",
                     str(len(done)), *(_interval(ivs.get(f), k, spec) for f, _, k, spec in SHOWN)])
    if rows:
        out["repeats"] = (["repeat group", "runs", *(f"{name}: mean +/- 90 %" + (" (ms)" if k != 1 else "")
                                                     for _, name, k, _ in SHOWN)], rows)
    return out


def _interval(iv: dict | None, k: float, spec: str) -> str:
    if iv is None:
        return "-"
    return f"{iv['mean'] * k:{spec}} +/- {iv['half'] * k:{spec}} [{iv['low'] * k:{spec}} .. {iv['high'] * k:{spec}}]"


def _f(v: float | None, spec: str, div: float = 1.0) -> str:
    return "-" if v is None or v != v else f"{v / div:{spec}}"
