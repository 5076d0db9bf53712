"""The campaign keys of the measurements (read after the file's other keys, each problem one line like theirs):
`stop_grace` (seconds between SIGTERM and SIGKILL, top level or per deployment), a deployment's `gpu_metrics`
(its nodes' DCGM exporter endpoints), a load's `repeats` and `max_concurrency`, and workload files named relative
to the campaign file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.campaign.problems import Problems


def with_stop_grace(problems: Problems, raw: dict, deps: list) -> list:
    """Each deployment's stop_grace (seconds between SIGTERM and SIGKILL), its own or the campaign's, default 30."""
    top = _grace(problems, "stop_grace", raw.get("stop_grace", 30.0))
    out = []
    for i, (d, r) in enumerate(zip(deps, raw.get("deployments") or [], strict=False)):
        if d is not None and isinstance(r, dict) and "stop_grace" in r:
            d = replace(d, stop_grace_s=_grace(problems, f"deployments[{i}].stop_grace", r["stop_grace"]))
        elif d is not None:
            d = replace(d, stop_grace_s=top)
        out.append(d)
    return out


def with_gpu_metrics(problems: Problems, raw: dict, deps: list) -> list:
    """Each deployment's `gpu_metrics`: a list of its GPU nodes' Prometheus endpoints (DCGM exporter's
    http://NODE:9400/metrics), scraped during each of its runs; no credentials in them (they are stored)."""
    from bench.campaign.guard import check_url

    out = []
    for i, (d, r) in enumerate(zip(deps, raw.get("deployments") or [], strict=False)):
        urls = r.get("gpu_metrics") if isinstance(r, dict) else None
        if d is not None and urls is not None:
            where = f"deployments[{i}].gpu_metrics"
            if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
                problems.add(where, "a list of URLs is required, e.g. [http://node1:9400/metrics]")
            else:
                wrong = [f"[{k}]: {w}" for k, u in enumerate(urls) if (w := check_url(u)) is not None]
                for w in wrong:
                    problems.add(where, w)
                if not wrong:
                    d = replace(d, gpu_metrics=tuple(u.rstrip("/") for u in urls))
        out.append(d)
    return out


def workload_path(workload: str, base: Path | None) -> str:
    """A workload file named relative to the campaign file resolves against that file's folder (so a campaign runs
    the same from any folder); a built-in name or an absolute path stays as it is."""
    from bench.model import workload_names

    if base is None or workload in workload_names() or Path(workload).is_absolute():
        return workload
    beside = base / workload
    return str(beside.resolve()) if beside.is_file() else workload


def with_repeats(problems: Problems, raw: dict, loads: list) -> list:
    """Each load's `repeats` (1 to 20): how many times its sweep runs, for intervals on its figures."""
    out = []
    for i, (x, r) in enumerate(zip(loads, raw.get("loads") or [], strict=False)):
        if x is not None and isinstance(r, dict) and "repeats" in r:
            n = r["repeats"]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 20:
                problems.add(f"loads[{i}].repeats", f"a whole number from 1 to 20, got {n!r}")
            else:
                x = replace(x, repeats=n)
        out.append(x)
    return out


def with_caps(problems: Problems, raw: dict, loads: list) -> list:
    """Each open-loop load's `max_concurrency`: at most this many requests in flight, arrivals wait in the client."""
    out = []
    for i, (x, r) in enumerate(zip(loads, raw.get("loads") or [], strict=False)):
        n = r.get("max_concurrency") if isinstance(r, dict) else None
        if x is not None and n is not None:
            where = f"loads[{i}].max_concurrency"
            if x.profile == "users":
                problems.add(where, "a users load holds its users in flight already: drop one")
            elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
                problems.add(where, f"must be positive, a whole number, got {n!r}")
            else:
                x = replace(x, max_concurrency=n)
        out.append(x)
    return out


def _grace(problems: Problems, where: str, value: object) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = -1.0
    if not 0 <= v <= 3600:
        problems.add(where, f"seconds from 0 to 3600, got {value!r}")
        return 30.0
    return v
