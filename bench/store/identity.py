"""A run's identity: what it ran (model, GPUs, parallelism, KV dtype, expert weights, checksum mode), under which
load, when, and whether a twin modelled it or it was measured on a host. One description, shown by every picker,
table, `capbench runs` and report; built from runinfo.run_config (the run's config JSON) plus when and where."""

from __future__ import annotations

import math

import pandas as pd


def identity_fields(c: dict) -> dict[str, str]:
    """A run's identity as named fields (the columns of the run tables), from a runs_table row or run_config plus
    started/host: when, model, GPUs, parallelism, KV cache, experts, checksum, load, workload, source. Rates of a
    twin are in the modelled GPUs' time."""
    from bench.model import capacity, catalog

    c = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in c.items()}  # a table row's gaps
    models = catalog.models()
    m = models.get(c.get("model") or "")
    tp = c.get("tp")
    par = (f"tp{tp}" + (f" dp{c['dp']}" if (c.get("dp") or 1) > 1 else "")
           + (f" ep{c['ep']}" if (c.get("ep") or 1) > 1 else "")) if tp else "?"
    experts = ""
    if c.get("weights") and m:
        fmt = capacity.weight_formats(m, c["weights"])[0]
        experts = fmt.upper() + (" (as shipped)" if fmt == capacity.weight_formats(m, "native")[0] else
                                 " (converted)")
    elif c.get("weights"):
        experts = str(c["weights"])
    scale = float(c.get("time_scale") or 1.0) if c.get("twin") else 1.0
    rate = next((float(v) for v in (c.get("offered_rps"), c.get("rate")) if _given(v)), None)
    users = c.get("users") if _given(c.get("users")) else None
    profile = c.get("profile") or "load"
    if rate:
        load = f"{profile} {rate / scale:.3g} req/s"
    elif users:
        load = f"{int(users)} users" + (" (closed loop)" if profile == "users" else f", {profile}")
    else:
        load = profile
    when = str(c.get("started") or "")[:16]
    return {"started (UTC)": when, "model": m.name if m else (c.get("model") or "unknown model"),
            "GPUs": f"{tp or '?'}x {(c.get('gpu') or 'unknown GPU').upper()}", "parallelism": par,
            "KV cache": (c.get("kv_dtype") or "bf16").replace("_e4m3", "").upper(), "experts": experts,
            "checksum": c.get("kv_checksum") or "off", "load": load, "workload": c.get("workload") or "",
            "source": "twin (modelled)" if c.get("twin") else f"imported ({c['imported']})" if c.get("imported")
            else (f"measured on {c['host']}" if c.get("host") else "measured")}


def identity(row: dict) -> str:
    """A run in one line: 'Kimi K2 Thinking, 8x H200 tp8, FP8 KV, INT4-G32 experts (as shipped), checksum verify ·
    poisson 2 req/s, chat · 2026-12-01 21:00 UTC · twin (modelled)': what pickers, tables, `capbench runs` and
    reports show (row: a runs_table row, or run_config plus started/host/label); the run's label, if any, last."""
    f = identity_fields(row)
    experts = f["experts"].replace(" (", " experts (", 1) if "(" in f["experts"] else f["experts"] and \
        f"{f['experts']} experts"
    deployment = ", ".join(x for x in (f["model"], f"{f['GPUs']} {f['parallelism']}", f"{f['KV cache']} KV", experts,
                                       f["checksum"] != "off" and f"checksum {f['checksum']}") if x)
    load = f["load"] + (f", {f['workload']}" if f["workload"] else "")
    when = f["started (UTC)"] and f["started (UTC)"] + " UTC"
    label = row.get("label") if isinstance(row.get("label"), str) else ""
    return " · ".join(x for x in (deployment, load, when, f["source"], label and f"'{label}'") if x)


IDENTITY_COLUMNS = ("started (UTC)", "model", "GPUs", "parallelism", "KV cache", "experts", "checksum", "load",
                    "workload", "source")


def runs_display(runs: pd.DataFrame) -> pd.DataFrame:
    """runs_table rows as the run tables show them: the identity fields, label, status, requests, errors, run id."""
    rows = [{**identity_fields(r), "label": r.get("label") or "", "status": r.get("status"),
             "requests": r.get("requests"), "errors": r.get("errors"), "run id": r.get("run_id")}
            for r in runs.to_dict("records")]
    return pd.DataFrame(rows, columns=[*IDENTITY_COLUMNS, "label", "status", "requests", "errors", "run id"])


def _given(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != 0


def short(row: dict) -> str:
    """The identity without when and source, for chart legends and axes: 'Kimi K2 Thinking, 8x H200 tp8, FP8 KV,
    INT4-G32 experts (as shipped) · poisson 2 req/s, chat'."""
    return " · ".join(identity(row).split(" · ")[:2])
