"""SGLang's bench_serving --output-file JSONL: one JSON object per run (the file is appended to), its summary
(backend, dataset_name, request_rate, max_concurrency, duration, completed, request_throughput, ...) and, with
--output-details, per-request lists of one entry per request: input_lens, output_lens, ttfts, itls (a list of
gaps per request), generated_texts, errors (and cached_tokens with --cache-report). It records no per-request wall
clock: send, first-token and finish times stay NULL, e2e and TPOT are rebuilt from TTFT and the gaps. A line
without the lists (saved without --output-details; vLLM's --save-result without --save-detailed) is imported as
a summary-only run: its mean/median/std/pN _ttft_ms, _tpot_ms, _itl_ms, _e2e_latency_ms (vLLM: _e2el_ms) and its
counts and throughputs into run_summaries (sgl-project/sglang python/sglang/bench_serving.py, benchmark())."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from bench.errors import BadInput
from bench.imports.common import Export, Figures, Seconds, Tokens, ToolRun, check, parse

NAME = "bench-serving"
WHAT = "output file (bench_serving)"
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
Gap = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
# bench_serving writes its default rate, float('inf'), as the bare JSON word Infinity: read as the text "inf"
_INF_RATE = re.compile(rb'("request_rate"\s*:\s*)Infinity')
_LATENCY_KEY = re.compile(r"(?P<stat>mean|median|std|p\d+(?:\.\d+)?)_(?P<metric>ttft|tpot|itl|e2el|e2e_latency)_ms")


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
        given = [k for k in LISTS if getattr(run, k) is not None]
        if given and len(given) < len(LISTS):
            raise BadInput(f"{where}: some per-request lists but not all: {', '.join(sorted(set(LISTS) - set(given)))}"
                           " missing (bench_serving --output-details writes all of them)")
        rate = run.request_rate if isinstance(run.request_rate, float) and run.request_rate > 0 else None
        summary = [] if given else _summary(line, run, where)
        out.append(ToolRun(
            digest=hashlib.sha256(texts[i - 1]).hexdigest() if len(texts) == len(lines) else digest,
            requests={} if summary else _columns(run), index=i if len(lines) > 1 else None, rate=rate,
            users=run.max_concurrency,
            profile="bench_serving" + (" max-concurrency" if run.max_concurrency and not rate else ""),
            workload=run.dataset_name, target=run.backend or "",
            started_at=mtime - run.duration, finished_at=mtime, summary=summary,
            derived=["run start/finish: the file's modification time less duration (no wall clock in the file)"]
            + ([] if summary else ["e2e_s: ttft + sum(itls)", "tpot_s: sum(itls) / (output_len - 1)"]),
            missing=(["every request (a summary only: saved without --output-details)"]
                     + ([] if "failed" in line else ["errors (SGLang's summary counts successes only)"])) if summary
            else ["scheduled_at", "sent_at", "first_token_at", "finished_at", "dispatch_lag_s"],
            figures={k: getattr(run, k) for k in ("completed", "duration", "request_throughput", "request_rate")}))
    return out


def _summary(line: dict, run: Run, where: str) -> list[tuple[str, str, float, str]]:
    """A line without per-request lists: its own figures (SGLang: mean/median/std/p99 _ttft_ms, _tpot_ms, _itl_ms,
    _e2e_latency_ms; vLLM: the same with _e2el_ms and p<N>_ for each --metric-percentiles) as run_summaries rows."""
    f = Figures(where)
    f.add("requests", "ok", run.completed, "requests")
    f.add("requests", "errors", line.get("failed"), "requests", name="failed")  # vLLM counts them, SGLang does not
    f.add("duration", "total", run.duration, "s")
    for key, stat, unit in (("request_throughput", "requests", "req/s"), ("input_throughput", "input_tokens", "tok/s"),
                            ("output_throughput", "output_tokens", "tok/s")):
        f.add("throughput", stat, line.get(key), unit, name=key)
    f.add("tokens", "input", line.get("total_input_tokens"), "tokens", name="total_input_tokens")
    f.add("tokens", "output", line.get("total_output_tokens"), "tokens", name="total_output_tokens")
    for key, value in line.items():
        m = _LATENCY_KEY.fullmatch(key)
        if m:
            stat = {"median": "p50"}.get(m["stat"], m["stat"])
            f.add({"e2el": "e2e", "e2e_latency": "e2e"}.get(m["metric"], m["metric"]), stat, value, "s", 1e-3, key)
    if not f.has("ttft") and not f.has("e2e"):
        raise BadInput(f"{where}: neither per-request lists ({', '.join(LISTS)}) nor latency figures "
                       "(median_ttft_ms, p99_ttft_ms, ...): not a bench_serving result")
    return f.rows


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
