"""SGLang's bench_serving --output-file JSONL: one JSON object per run (the file is appended to), its summary
(backend, dataset_name, request_rate, max_concurrency, duration, completed, request_throughput, ...) and, with
--output-details, per-request lists of one entry per request: input_lens, output_lens, ttfts, itls (a list of
gaps per request), generated_texts, errors (and cached_tokens with --cache-report). It records no per-request wall
clock: send, first-token and finish times stay NULL, e2e and TPOT are rebuilt from TTFT and the gaps."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from bench.errors import BadInput
from bench.imports.common import Export, Seconds, Tokens, ToolRun, check, parse

NAME = "bench-serving"
WHAT = "output file (bench_serving)"
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
Gap = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
# bench_serving writes its default rate, float('inf'), as the bare JSON word Infinity: read as the text "inf"
_INF_RATE = re.compile(rb'("request_rate"\s*:\s*)Infinity')


class Run(Export):
    backend: str | None = None
    dataset_name: str | None = None
    request_rate: float | str | None = None
    max_concurrency: int | None = Field(None, ge=1)
    duration: Seconds
    completed: Tokens
    request_throughput: float | None = None
    input_lens: list[Tokens] | None = None
    output_lens: list[Tokens] | None = None
    ttfts: list[Seconds] | None = None
    itls: list[list[Gap]] | None = None
    errors: list[str | None] | None = None
    cached_tokens: list[Tokens | None] | None = None

    @model_validator(mode="after")
    def _lists_agree(self) -> Run:
        lens = {k: len(getattr(self, k)) for k in (*LISTS, "cached_tokens") if getattr(self, k) is not None}
        if len(set(lens.values())) > 1:
            raise ValueError("the per-request lists differ in length: "
                             + ", ".join(f"{k} {n}" for k, n in lens.items()))
        return self


def looks_like(doc: object) -> bool:
    first = doc[0] if isinstance(doc, list) and doc else doc
    return isinstance(first, dict) and "duration" in first and "completed" in first and (
        "ttfts" in first or "backend" in first or "median_ttft_ms" in first)


def read(data: bytes, source: str) -> object:
    return parse(_INF_RATE.sub(rb'\1"inf"', data), source, WHAT)


def runs(doc: object, source: str, digest: str, path: Path, data: bytes) -> list[ToolRun]:
    lines = doc if isinstance(doc, list) else [doc]
    texts = [line for line in data.splitlines() if line.strip()]
    if not lines:
        raise BadInput(f"{source}: no runs; bench_serving writes one JSON object per run")
    mtime = os.stat(path).st_mtime
    out = []
    for i, line in enumerate(lines, 1):
        where = f"{source}: line {i}" if len(lines) > 1 else source
        run = check(Run, line, where)
        if any(getattr(run, k) is None for k in LISTS):
            raise BadInput(f"{where}: a summary only, without the per-request lists ({', '.join(LISTS)}): run "
                           "bench_serving with --output-details (percentiles cannot be rebuilt from a summary)")
        rate = run.request_rate if isinstance(run.request_rate, float) and run.request_rate > 0 else None
        out.append(ToolRun(
            digest=hashlib.sha256(texts[i - 1]).hexdigest() if len(texts) == len(lines) else digest,
            requests=_columns(run), index=i if len(lines) > 1 else None, rate=rate, users=run.max_concurrency,
            profile="bench_serving" + (" max-concurrency" if run.max_concurrency and not rate else ""),
            workload=run.dataset_name, target=run.backend or "",
            started_at=mtime - run.duration, finished_at=mtime,
            derived=["e2e_s: ttft + sum(itls)", "tpot_s: sum(itls) / (output_len - 1)",
                     "run start/finish: the file's modification time less duration (no wall clock in the file)"],
            missing=["scheduled_at", "sent_at", "first_token_at", "finished_at", "dispatch_lag_s"],
            figures={k: getattr(run, k) for k in ("completed", "duration", "request_throughput", "request_rate")}))
    return out


def _columns(run: Run) -> dict[str, list]:
    cols: dict[str, list] = {k: [] for k in ("request_id", "ttft_s", "e2e_s", "tpot_s", "itl_s", "prompt_tokens",
                                              "completion_tokens", "cached_tokens", "status", "error_kind",
                                              "error", "tokens_from")}
    cached = run.cached_tokens or [None] * len(run.ttfts)
    for i, (n_in, n_out, ttft, gaps, err) in enumerate(zip(run.input_lens, run.output_lens, run.ttfts, run.itls,
                                                           run.errors, strict=True)):
        ok = not err
        decode = sum(gaps)
        cols["request_id"].append(str(i))
        cols["ttft_s"].append(ttft if ok else None)
        cols["e2e_s"].append(ttft + decode if ok else None)
        cols["tpot_s"].append(decode / (n_out - 1) if ok and n_out > 1 else None)
        cols["itl_s"].append(gaps)
        cols["prompt_tokens"].append(n_in)
        cols["completion_tokens"].append(n_out if ok else None)
        cols["cached_tokens"].append(cached[i])
        cols["status"].append("ok" if ok else "error")
        cols["error_kind"].append(None if ok else "error")
        cols["error"].append(None if ok else str(err)[:1000])
        cols["tokens_from"].append("bench_serving")
    return cols
