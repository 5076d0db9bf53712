"""A load's eval stage: quality measured on the cell's own server, beside its throughput. A load may carry

    eval: {suites: [humaneval, bfcl-multi-turn], limit: 40, seed: 0, when: after}

`when: after` (the default) runs the suites once the load's sweep is done, on the same server; `when: during` starts
them with the sweep, so the answers are given under its load (and the eval's requests are part of that load: the
sweep's figures then include them). The stage is `capbench eval` in a process of its own (the campaign's process is
gevent's); its run holds every answer, and the cell's result its run id and pass rates. The report pairs each
cell's answers with its baseline's (bench/report/quality.py). A stage that fails leaves the cell's throughput
figures as they are and says why in place of its quality.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bench.campaign.problems import Problems

EVAL_KEYS = {"suites", "limit", "seed", "when", "timeout", "concurrency"}
WHEN = ("after", "during")


@dataclass(frozen=True)
class EvalStage:
    suites: str = "humaneval"  # comma-separated, as `capbench eval --suite`
    limit: int | None = None
    seed: int = 0
    when: str = "after"
    timeout_s: float = 600.0  # per request
    concurrency: int = 4


def with_eval(problems: Problems, raw: dict, loads: list) -> list:
    """Each load's `eval` key read and checked (every problem one line, as the file's other keys)."""
    out = []
    for i, (x, r) in enumerate(zip(loads, raw.get("loads") or [], strict=False)):
        if x is not None and isinstance(r, dict) and "eval" in r:
            stage = parse(problems, f"loads[{i}].eval", r["eval"])
            x = replace(x, eval=stage) if stage else x
        out.append(x)
    return out


def parse(problems: Problems, where: str, raw: object) -> EvalStage | None:
    from bench.errors import BadInput
    from bench.eval import suites as known

    if not isinstance(raw, dict):
        problems.add(where, "a mapping with suites (and limit, seed, when, timeout, concurrency) is required")
        return None
    for key in raw:
        if key not in EVAL_KEYS:
            problems.add(f"{where}.{key}", f"unknown key (known: {', '.join(sorted(EVAL_KEYS))})")
    names = raw.get("suites", "humaneval")
    text = ",".join(map(str, names)) if isinstance(names, list) else str(names)
    try:
        if "long" in known.parse(text):
            problems.add(f"{where}.suites", "long compares two endpoints; a cell's eval has one (use capbench eval)")
    except BadInput as e:
        problems.add(f"{where}.suites", str(e))
    ints = {}
    for key, low, high in (("limit", 1, 100_000), ("seed", 0, 2**31 - 1), ("concurrency", 1, 256)):
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high):
            problems.add(f"{where}.{key}", f"a whole number from {low} to {high}, got {v!r}")
        ints[key] = v
    timeout = raw.get("timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 86400:
        problems.add(f"{where}.timeout", f"seconds from 1 to 86400, got {timeout!r}")
    when = raw.get("when", "after")
    if when not in WHEN:
        problems.add(f"{where}.when", f"{when!r} is not one of {', '.join(WHEN)}")
    if any(p.startswith(f"{where}") for p in problems):
        return None
    return EvalStage(text, ints["limit"], ints["seed"] or 0, str(when), float(timeout), ints["concurrency"] or 4)


def start(stage: EvalStage, url: str, db: Path, label: str, api_key_env: str | None) -> subprocess.Popen:
    argv = [sys.executable, "-c", "from bench.cli import main; main()", "eval", "--target", url, "--suite",
            stage.suites, "--seed", str(stage.seed), "--db", str(db), "--label", label, "--timeout",
            str(stage.timeout_s), "--concurrency", str(stage.concurrency), "--json"]
    argv += ["--limit", str(stage.limit)] if stage.limit else []
    argv += ["--api-key-env", api_key_env] if api_key_env else []
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])


def finish(proc: subprocess.Popen, kv_scales: bool) -> dict:
    """The stage's result for the cell: its eval run and per suite the pass rate, or why it has none."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        why = next((x for x in reversed(err.strip().splitlines()) if x.strip()), f"exit {proc.returncode}")
        return {"error": why[:300]}
    said = json.loads(out)
    return {"run_id": said["run_id"], "kv_scales": kv_scales, "twin": said.get("twin", False),
            "suites": {s["suite"]: s["sides"][0] for s in said["suites"] if s.get("sides")}}
