"""What every import shares: the tool's file read once through bench.files (a regular file of bounded size, UTF-8,
JSON without NaN), its digest, problems as one line, the deployment spec checked, and each run's provenance."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from bench import files
from bench.errors import BadInput

MAX_BYTES = 256 << 20  # ~250,000 AIPerf records; parsed whole, so far bigger files would not fit in memory
Seconds = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]  # a latency or duration
Epoch = Annotated[float, Field(gt=0, le=1e11, allow_inf_nan=False)]  # a wall-clock time, epoch seconds
Tokens = files.Whole  # a token count: 0 .. 2**31 - 1
M = TypeVar("M", bound=BaseModel)


class Export(BaseModel):
    """A tool's record: keys this import does not read are ignored (the tools add fields), every number finite."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)


@dataclass
class ToolRun:
    """One run as a tool's file gives it, its requests already as the store's columns."""

    digest: str  # sha256 of the run's own text (the file's, or its line's where a file holds several runs)
    requests: dict[str, list]
    index: int | None = None  # which of the file's runs (bench_serving's line, guidellm's benchmark)
    tool_version: str | None = None
    target: str = ""
    profile: str = ""
    rate: float | None = None
    users: int | None = None
    workload: str | None = None
    started_at: float | None = None  # None: from the requests' times
    finished_at: float | None = None
    derived: list[str] = field(default_factory=list)  # how columns the tool did not write were rebuilt
    missing: list[str] = field(default_factory=list)  # columns left NULL: the tool does not record them
    figures: dict = field(default_factory=dict)  # the tool's own headline figures, kept beside the rows
    summary: list[tuple[str, str, float, str]] = field(default_factory=list)  # run_summaries rows: no requests


LATENCIES = ("ttft", "tpot", "itl", "e2e")  # run_summaries' latency metrics, in seconds


class Figures:
    """A summary-only file's figures as run_summaries rows (metric, stat, value, unit): latencies (LATENCIES, stat
    mean/p50/p90/p99/std/min/max) in seconds; requests ok/errors; duration total (s); throughput requests (req/s),
    input_tokens / output_tokens (tok/s); tokens input / output. A value that is not a finite number >= 0 is a
    bad file (one line)."""

    def __init__(self, where: str):
        self.where, self.rows = where, []

    def add(self, metric: str, stat: str, value: object, unit: str, scale: float = 1.0, name: str = "") -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise BadInput(f"{self.where}: {name or metric + ' ' + stat}: a finite number >= 0, got {value!r}")
        self.rows.append((metric, stat, float(value) * scale, unit))

    def has(self, metric: str, stat: str | None = None) -> bool:
        return any(row[0] == metric and stat in (None, row[1]) for row in self.rows)


def read_bytes(path: str | Path, what: str) -> tuple[bytes, str]:
    """The file's bytes (bench.files.regular_file: no FIFO, at most MAX_BYTES) and their sha256."""
    data = files.regular_file(path, what, MAX_BYTES)
    return data, hashlib.sha256(data).hexdigest()


def parse(data: bytes | str, source: str, what: str) -> object:
    """The document: one JSON value, or JSON lines (a list of values), with bench.files' limits (NaN refused)."""
    try:
        return files.parse(data, source, what, "json", MAX_BYTES)
    except BadInput as whole:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        if sum(1 for line in text.splitlines() if line.strip()) < 2:
            raise whole from None
    return files.parse(data, source, what, "jsonl", MAX_BYTES)


def check(schema: type[M], data: object, source: str) -> M:
    """The data as the schema, or BadInput in one line: the first problem and how many more there are."""
    model, wrong = files.problems(schema, data)
    if wrong:
        more = f" (and {len(wrong) - 1} more problems)" if len(wrong) > 1 else ""
        raise BadInput(f"{source}: {wrong[0]}{more}")
    return model


def deployment_spec(text: str) -> str:
    """The --deployment text checked as a deployment spec (MODEL@GPUxN,k=v: the catalog's model and GPU)."""
    from bench.model import parse_spec

    spec = text.strip().removeprefix("twin:")
    parse_spec(spec).deployment()  # BadInput names an unknown model, GPU or option
    return spec


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def store_runs(tool: str, path: Path, file_sha256: str, runs: list[ToolRun], deployment: str,
               label: str) -> list[dict]:
    """The runs as bench.store.write_imported_runs takes them, provenance in config.import."""
    now = time.time()
    out = []
    for r in runs:
        sent = [t for t in r.requests.get("sent_at", []) if t is not None]
        done = [t for t in r.requests.get("finished_at", []) if t is not None]
        started = r.started_at if r.started_at is not None else (min(sent) if sent else now)
        finished = r.finished_at if r.finished_at is not None else (max(done) if done else started)
        params = {k: v for k, v in (("rate", r.rate), ("users", r.users)) if v is not None}
        config = {
            "deployment": deployment, "target": r.target, "workload": r.workload,
            "profile": {"name": r.profile, "params": params},
            "import": {"tool": tool, "tool_version": r.tool_version, "file": path.name, "path": str(path),
                       "sha256": file_sha256, "record": r.index, "record_sha256": r.digest, "imported_at": now,
                       "requests": len(next(iter(r.requests.values()), [])) if not r.summary else
                       int(sum(row[2] for row in r.summary if row[0] == "requests")),
                       "summary_only": bool(r.summary), "derived": r.derived, "null": r.missing,
                       "figures": r.figures},
        }
        out.append({"label": label, "target": r.target, "profile": r.profile, "config": config,
                    "started_at": started, "finished_at": finished, "requests": r.requests, "summary": r.summary})
    return out
