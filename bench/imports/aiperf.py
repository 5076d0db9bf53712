"""NVIDIA AIPerf's profile_export.jsonl: one record per request, {metadata: {x_request_id, x_correlation_id,
turn_index, request_start_ns, request_end_ns, benchmark_phase, was_cancelled}, metrics: {NAME: {value, unit}},
error: {code, type, message} | null}. profile_export_aiperf.json beside it, where present, gives the AIPerf version
and the load (input_config.loadgen concurrency / request_rate, endpoint url). That summary imported alone (no
profile_export.jsonl beside it) is a summary-only run: each metric's {unit, avg, p50..p99, std, min, max}
(ai-dynamo/aiperf src/aiperf/common/models/export_models.py JsonMetricResult) into run_summaries."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import Field, model_validator

from bench import files
from bench.errors import BadInput
from bench.imports.common import Export, Figures, ToolRun, check

NAME = "aiperf"
WHAT = "profile export (AIPerf)"
SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"
# the summary's latency metrics (aiperf/common/models/export_models.py JsonExportData) -> run_summaries' names
SUMMARY_LATENCIES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "inter_chunk_latency": "itl",
                     "request_latency": "e2e"}
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


class Metric(Export):
    value: float | list[float]
    unit: str = ""

    @model_validator(mode="after")
    def _not_negative(self) -> Metric:
        values = self.value if isinstance(self.value, list) else [self.value]
        if values and min(values) < 0:
            raise ValueError(f"a count or time is never negative, got {min(values)}")
        return self


class Metadata(Export):
    x_request_id: str | None = None
    x_correlation_id: str | None = None
    session_num: int | None = None
    turn_index: int | None = Field(None, ge=0)
    request_start_ns: int = Field(gt=0)
    request_end_ns: int | None = Field(None, gt=0)
    benchmark_phase: str = "profiling"
    was_cancelled: bool = False

    @model_validator(mode="after")
    def _ends_after_start(self) -> Metadata:
        if self.request_end_ns is not None and self.request_end_ns < self.request_start_ns:
            raise ValueError("request_end_ns is before request_start_ns")
        return self


class ErrorDetails(Export):
    code: int | None = None
    type: str | None = None
    message: str | None = None


class Record(Export):
    metadata: Metadata
    metrics: dict[str, Metric] | None = None
    error: ErrorDetails | None = None


def looks_like(doc: object) -> bool:
    first = doc[0] if isinstance(doc, list) and doc else doc
    return isinstance(first, dict) and (isinstance(first.get("metadata"), dict) and "request_start_ns" in
                                        first["metadata"] or "aiperf_version" in first or "input_config" in first)


def runs(doc: object, source: str, digest: str, path: Path, data: bytes = b"") -> list[ToolRun]:
    if isinstance(doc, dict) and ("aiperf_version" in doc or "input_config" in doc or "records" in doc):
        if (path.parent / RECORDS_FILE).is_file():
            raise BadInput(f"{source}: AIPerf's summary; {RECORDS_FILE} beside it has every request: import that "
                           "instead")
        return [_summary_run(doc, source, digest, path)]
    lines = doc if isinstance(doc, list) else [doc]
    if not lines:
        raise BadInput(f"{source}: no records; an {WHAT} has one JSON object per request")
    records = [check(Record, line, f"{source}: line {i}") for i, line in enumerate(lines, 1)]
    cols: dict[str, list] = {k: [] for k in (
        "request_id", "phase", "sent_at", "first_token_at", "finished_at", "ttft_s", "e2e_s", "tpot_s", "itl_s",
        "prompt_tokens", "completion_tokens", "reasoning_tokens", "ttfc_s", "session_id", "turn", "status",
        "error_kind", "error", "tokens_from")}
    for i, rec in enumerate(records, 1):
        for key, value in _row(rec, f"{source}: line {i}").items():
            cols[key].append(value)
    summary = _summary(path)
    load = _load(summary)
    return [ToolRun(
        digest=digest, requests=cols, tool_version=summary.get("aiperf_version"), target=load["target"],
        rate=load["rate"], users=load["users"], profile=load["profile"],
        derived=["first_token_at: request_start_ns + time_to_first_token",
                 "finished_at: request_end_ns (else start + request_latency)",
                 "itl_s: inter_chunk_latency (per streamed chunk)"],
        missing=["scheduled_at", "dispatch_lag_s", "cached_tokens"] + ([] if summary else [f"load ({SUMMARY_FILE} "
                                                                                            "not found beside it)"]),
        figures={"records": len(records), "summary_file": SUMMARY_FILE if summary else None})]


def _summary_run(doc: dict, source: str, digest: str, path: Path) -> ToolRun:
    """profile_export_aiperf.json alone: each metric's {unit, avg, p50, p90, p99, std, min, max}, at the top level
    (AIPerf >= 0.3, JsonExportData) or under `records` (earlier)."""
    metrics = doc.get("records") if isinstance(doc.get("records"), dict) else doc
    f = Figures(source)
    for tag, metric in SUMMARY_LATENCIES.items():
        m = metrics.get(tag)
        if not isinstance(m, dict):
            continue
        if m.get("unit") not in UNITS:
            raise BadInput(f"{source}: {tag}.unit: a time unit ({', '.join(UNITS)}), got {m.get('unit')!r}")
        for stat in ("avg", "p50", "p90", "p95", "p99", "std", "min", "max"):
            f.add(metric, "mean" if stat == "avg" else stat, m.get(stat), "s", UNITS[m["unit"]], f"{tag}.{stat}")
    for tag, metric, stat, unit in (("request_count", "requests", "ok", "requests"),
                                    ("error_request_count", "requests", "errors", "requests"),
                                    ("benchmark_duration", "duration", "total", "s"),
                                    ("request_throughput", "throughput", "requests", "req/s"),
                                    ("output_token_throughput", "throughput", "output_tokens", "tok/s"),
                                    ("total_isl", "tokens", "input", "tokens"),
                                    ("total_osl", "tokens", "output", "tokens")):
        m = metrics.get(tag)
        f.add(metric, stat, m.get("avg") if isinstance(m, dict) else None, unit, name=f"{tag}.avg")
    if not f.has("requests", "ok") or not (f.has("ttft") or f.has("e2e")):
        raise BadInput(f"{source}: an AIPerf summary without request_count and time_to_first_token or request_latency")
    load = _load(doc)
    when = [_epoch(doc.get(k)) for k in ("start_time", "end_time")]
    return ToolRun(
        digest=digest, requests={}, summary=f.rows, tool_version=doc.get("aiperf_version"), target=load["target"],
        rate=load["rate"], users=load["users"], profile=load["profile"], started_at=when[0], finished_at=when[1],
        derived=["tpot: inter_token_latency (per request: (latency - TTFT) / (output tokens - 1))",
                 "itl: inter_chunk_latency"],
        missing=[f"every request ({RECORDS_FILE} not imported)"], figures={"summary_file": path.name})


def _epoch(text: object) -> float | None:
    """AIPerf's start_time / end_time: an ISO datetime in the machine's local time (datetime.fromtimestamp)."""
    try:
        return datetime.fromisoformat(text).timestamp() if isinstance(text, str) else None
    except ValueError:
        return None


def _row(rec: Record, where: str) -> dict:
    m, md = rec.metrics or {}, rec.metadata

    def value(name: str, time: bool = False) -> float | list | None:
        metric = m.get(name)
        if metric is None:
            return None
        scale = 1.0
        if time:
            if metric.unit not in UNITS:
                raise BadInput(f"{where}: metrics.{name}.unit: a time unit ({', '.join(UNITS)}), got {metric.unit!r}")
            scale = UNITS[metric.unit]
        v = metric.value
        return [x * scale for x in v] if isinstance(v, list) else v * scale

    def count(name: str) -> int | None:
        v = value(name)
        return int(v) if isinstance(v, float | int) else None

    sent = md.request_start_ns / 1e9
    ttft, e2e = value("time_to_first_token", True), value("request_latency", True)
    end = md.request_end_ns / 1e9 if md.request_end_ns else (sent + e2e if isinstance(e2e, float) else None)
    failed = rec.error is not None or md.was_cancelled
    err = rec.error or ErrorDetails()
    itl = value("inter_chunk_latency", True)
    return {
        "request_id": md.x_request_id or (str(md.session_num) if md.session_num is not None else None),
        "phase": "warmup" if md.benchmark_phase == "warmup" else "measured",
        "sent_at": sent, "first_token_at": sent + ttft if isinstance(ttft, float) else None, "finished_at": end,
        "ttft_s": ttft if isinstance(ttft, float) else None,
        "e2e_s": e2e if isinstance(e2e, float) else (end - sent if end is not None else None),
        "tpot_s": _scalar(value("inter_token_latency", True)), "itl_s": itl if isinstance(itl, list) else None,
        "prompt_tokens": count("input_sequence_length") if count("input_sequence_length") is not None
        else count("error_isl"),
        "completion_tokens": count("output_sequence_length") if count("output_sequence_length") is not None
        else count("output_token_count"),
        "reasoning_tokens": count("reasoning_token_count"), "ttfc_s": _scalar(value("time_to_first_output_token",
                                                                                      True)),
        "session_id": md.x_correlation_id, "turn": md.turn_index,
        "status": "error" if failed else "ok",
        "error_kind": ("cancelled" if md.was_cancelled else f"http_{err.code}" if err.code else err.type or "error")
        if failed else None,
        "error": (err.message or err.type or "cancelled")[:1000] if failed else None, "tokens_from": "aiperf",
    }


def _scalar(v: float | list | None) -> float | None:
    return v if isinstance(v, float) else None


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def _load(summary: dict) -> dict:
    """The load and target from the summary's input_config (loadgen concurrency / request_rate, endpoint url)."""
    config = summary.get("input_config") if isinstance(summary.get("input_config"), dict) else {}
    loadgen = config.get("loadgen") if isinstance(config.get("loadgen"), dict) else {}
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    rate, users = _number(loadgen.get("request_rate")), _number(loadgen.get("concurrency"))
    urls = endpoint.get("urls") or [endpoint.get("url")]
    return {"target": str(urls[0]) if isinstance(urls, list) and urls and urls[0] else "", "rate": rate,
            "users": int(users) if users else None,
            "profile": "aiperf request-rate" if rate else "aiperf concurrency" if users else "aiperf"}


def _summary(path: Path) -> dict:
    """profile_export_aiperf.json beside the records, if there and readable (it only adds provenance)."""
    beside = path.parent / SUMMARY_FILE
    if not beside.is_file():
        return {}
    try:
        doc = files.read(beside, WHAT + " summary", "json", 64 << 20)
    except BadInput:
        return {}
    return doc if isinstance(doc, dict) else {}
