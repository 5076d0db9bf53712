"""guidellm's benchmarks JSON report: {metadata: {guidellm_version}, args: {target}, benchmarks: [{config: {strategy:
{type_, rate, streams}}, start_time, end_time, requests: {successful, errored, incomplete}}]}, one run per benchmark.
Each request: request_id, info: {timings: {request_start, first_token_iteration, last_token_iteration,
request_end}, error, conversation_id, turn_index}, input_metrics / output_metrics: {total_tokens}, or the computed
prompt_tokens / output_tokens; guidellm 0.2-0.3 reports put start_time, first_token_time, last_token_time,
end_time on the request itself. A benchmark that kept no requests is a summary-only run from its metrics
(request_totals, time_to_first_token_ms, inter_token_latency_ms, request_latency, ...: successful distributions)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from bench.errors import BadInput
from bench.imports.common import Epoch, Export, Figures, Tokens, ToolRun, check

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
    requests: Breakdown = Breakdown()
    metrics: dict = {}
    request_totals: dict = {}  # {successful, incomplete, errored, total}: here, or in metrics (guidellm >= 0.4)
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
        summary = [] if cols["request_id"] else _summary(bench, f"{source}: benchmarks.{i - 1}")
        out.append(ToolRun(
            digest=digest if len(report.benchmarks) == 1 else f"{digest}:{i}", requests={} if summary else cols,
            index=i if len(report.benchmarks) > 1 else None, tool_version=str(version) if version else None,
            target=str(target or ""), profile=f"guidellm {kind}".strip(),
            rate=float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0 else None,
            users=int(streams) if isinstance(streams, int) and streams > 0 else None,
            started_at=bench.start_time, finished_at=bench.end_time, summary=summary,
            derived=["tpot: inter_token_latency_ms ((latency - TTFT) / (output tokens - 1))"] if summary else
            ["ttft_s: first token - request start", "e2e_s: request end - request start",
             "tpot_s: (last token - first token) / (output tokens - 1)"],
            missing=["every request (the report kept only metric summaries)"] if summary else
            ["scheduled_at", "dispatch_lag_s", "itl_s (guidellm keeps no per-token times)"],
            figures={status: len(getattr(bench.requests, status)) for status in STATUSES}))
    return out


# guidellm's GenerativeMetrics (src/guidellm/benchmark/schemas): each a StatusDistributionSummary whose
# `successful` is {mean, median, std_dev, min, max, count, total_sum, percentiles: {p50, p90, p95, p99, ...}}
SUMMARY_LATENCIES = {"time_to_first_token_ms": ("ttft", 1e-3), "inter_token_latency_ms": ("tpot", 1e-3),
                     "request_latency": ("e2e", 1.0)}


def _summary(bench: Benchmark, where: str) -> list[tuple[str, str, float, str]]:
    """A benchmark that kept no requests: its metrics' successful distributions as run_summaries rows."""
    m = bench.metrics

    def ok(name: str) -> dict:
        dist = m.get(name) if isinstance(m.get(name), dict) else {}
        return dist.get("successful") if isinstance(dist.get("successful"), dict) else {}

    f = Figures(where)
    for name, (metric, scale) in SUMMARY_LATENCIES.items():
        dist = ok(name)
        pct = dist.get("percentiles") if isinstance(dist.get("percentiles"), dict) else {}
        for stat, value in (("mean", dist.get("mean")), ("p50", dist.get("median")), ("std", dist.get("std_dev")),
                            ("min", dist.get("min")), ("max", dist.get("max")),
                            *((q, pct.get(q)) for q in ("p90", "p95", "p99"))):
            f.add(metric, stat, value, "s", scale, f"metrics.{name}.successful.{stat}")
    totals = m.get("request_totals") if isinstance(m.get("request_totals"), dict) else bench.request_totals
    f.add("requests", "ok", totals.get("successful"), "requests", name="metrics.request_totals.successful")
    if "errored" in totals or "incomplete" in totals:
        f.add("requests", "errors", (totals.get("errored") or 0) + (totals.get("incomplete") or 0), "requests",
              name="metrics.request_totals.errored")
    f.add("throughput", "requests", ok("requests_per_second").get("mean"), "req/s", name="requests_per_second")
    f.add("throughput", "output_tokens", ok("output_tokens_per_second").get("mean"), "tok/s",
          name="output_tokens_per_second")
    f.add("tokens", "input", ok("prompt_token_count").get("total_sum"), "tokens", name="prompt_token_count")
    f.add("tokens", "output", ok("output_token_count").get("total_sum"), "tokens", name="output_token_count")
    if bench.start_time and bench.end_time and bench.end_time >= bench.start_time:
        f.add("duration", "total", bench.end_time - bench.start_time, "s")
    if not f.has("requests", "ok") or not f.has("ttft"):
        raise BadInput(f"{where}: no requests and no metrics summary (request_totals, time_to_first_token_ms): "
                       "guidellm saved nothing to import for this benchmark")
    return f.rows


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
