"""guidellm's benchmarks JSON report: {metadata: {guidellm_version}, args: {target}, benchmarks: [{config: {strategy:
{type_, rate, streams}}, start_time, end_time, requests: {successful, errored, incomplete}}]}, one run per benchmark.
Each request: request_id, info: {timings: {request_start, first_token_iteration, last_token_iteration,
request_end}, error, conversation_id, turn_index}, input_metrics / output_metrics: {total_tokens}, or the computed
prompt_tokens / output_tokens; guidellm 0.2-0.3 reports put start_time, first_token_time, last_token_time,
end_time on the request itself."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from bench.errors import BadInput
from bench.imports.common import Epoch, Export, Tokens, ToolRun, check

NAME = "guidellm"
WHAT = "benchmarks report (guidellm)"
STATUSES = {"successful": ("ok", None), "errored": ("error", "error"), "incomplete": ("error", "cancelled")}


class Timings(Export):
    request_start: Epoch | None = None
    first_token_iteration: Epoch | None = None
    last_token_iteration: Epoch | None = None
    request_end: Epoch | None = None
    resolve_end: Epoch | None = None


class Info(Export):
    timings: Timings = Timings()
    error: str | None = None
    conversation_id: str | None = None
    turn_index: int | None = Field(None, ge=0)


class Usage(Export):
    total_tokens: Tokens | None = None


class Request(Export):
    request_id: str | None = None
    info: Info = Info()
    input_metrics: Usage = Usage()
    output_metrics: Usage = Usage()
    prompt_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    error: str | None = None
    start_time: Epoch | None = None  # guidellm 0.2-0.3
    first_token_time: Epoch | None = None
    last_token_time: Epoch | None = None
    end_time: Epoch | None = None

    def times(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(start, first token, last token, end), from info.timings or the older flat fields."""
        t = self.info.timings
        return (t.request_start or self.start_time, t.first_token_iteration or self.first_token_time,
                t.last_token_iteration or self.last_token_time, t.request_end or t.resolve_end or self.end_time)

    @model_validator(mode="after")
    def _in_order(self) -> Request:
        start, first, last, end = self.times()
        if start is not None and any(t is not None and t < start for t in (first, last, end)):
            raise ValueError("a token or end time is before the request's start")
        if first is not None and last is not None and last < first:
            raise ValueError("the last token's time is before the first's")
        return self


class Breakdown(Export):
    successful: list[Request] = []
    errored: list[Request] = []
    incomplete: list[Request] = []


class Benchmark(Export):
    requests: Breakdown
    config: dict = {}
    args: dict = {}
    start_time: Epoch | None = None
    end_time: Epoch | None = None


class Report(Export):
    metadata: dict = {}
    args: dict = {}
    benchmarks: list[Benchmark] = Field(min_length=1)


def looks_like(doc: object) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list)


def runs(doc: object, source: str, digest: str, path: Path, data: bytes = b"") -> list[ToolRun]:
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: not a {WHAT} (a JSON object with a benchmarks list)")
    report = check(Report, doc, source)
    version = report.metadata.get("guidellm_version")
    target = report.args.get("target")
    out = []
    for i, bench in enumerate(report.benchmarks, 1):
        strategy = bench.config.get("strategy") or bench.args.get("strategy") or {}
        strategy = strategy if isinstance(strategy, dict) else {}
        kind = str(strategy.get("type_") or strategy.get("type") or "")
        rate, streams = strategy.get("rate"), strategy.get("streams")
        cols = _columns(bench)
        if not cols["request_id"]:
            raise BadInput(f"{source}: benchmarks.{i - 1}.requests: no requests (guidellm saved none for this "
                           "benchmark)")
        out.append(ToolRun(
            digest=digest if len(report.benchmarks) == 1 else f"{digest}:{i}", requests=cols,
            index=i if len(report.benchmarks) > 1 else None, tool_version=str(version) if version else None,
            target=str(target or ""), profile=f"guidellm {kind}".strip(),
            rate=float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0 else None,
            users=int(streams) if isinstance(streams, int) and streams > 0 else None,
            started_at=bench.start_time, finished_at=bench.end_time,
            derived=["ttft_s: first token - request start", "e2e_s: request end - request start",
                     "tpot_s: (last token - first token) / (output tokens - 1)"],
            missing=["scheduled_at", "dispatch_lag_s", "itl_s (guidellm keeps no per-token times)"],
            figures={status: len(getattr(bench.requests, status)) for status in STATUSES}))
    return out


def _columns(bench: Benchmark) -> dict[str, list]:
    cols: dict[str, list] = {k: [] for k in (
        "request_id", "sent_at", "first_token_at", "finished_at", "ttft_s", "e2e_s", "tpot_s", "prompt_tokens",
        "completion_tokens", "session_id", "turn", "status", "error_kind", "error", "tokens_from")}
    for status, (state, kind) in STATUSES.items():
        for req in getattr(bench.requests, status):
            start, first, last, end = req.times()
            out = req.output_tokens if req.output_tokens is not None else req.output_metrics.total_tokens
            ok = state == "ok"
            row = {
                "request_id": req.request_id, "sent_at": start, "first_token_at": first, "finished_at": end,
                "ttft_s": first - start if ok and first is not None and start is not None else None,
                "e2e_s": end - start if ok and end is not None and start is not None else None,
                "tpot_s": (last - first) / (out - 1) if ok and out and out > 1 and first is not None
                and last is not None else None,
                "prompt_tokens": req.prompt_tokens if req.prompt_tokens is not None
                else req.input_metrics.total_tokens,
                "completion_tokens": out, "session_id": req.info.conversation_id, "turn": req.info.turn_index,
                "status": state, "error_kind": kind,
                "error": None if ok else (req.info.error or req.error or status)[:1000], "tokens_from": "guidellm"}
            for key, value in row.items():
                cols[key].append(value)
    return cols
