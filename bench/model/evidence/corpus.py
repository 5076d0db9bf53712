"""Published SGLang measurements (data/measurements/*.yaml, one file per source): the truth the performance model is
validated against. A case is one benchmark run: the deployment as launched, the workload as the benchmark drew it,
and the figures as published. The schema is data/measurements/README.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from bench.errors import BadInput
from bench.model.fits import catalog

MEASUREMENTS = catalog.DATA / "measurements"


@dataclass(frozen=True)
class Source:
    id: str
    org: str  # sources of one organisation are one independent source
    title: str
    url: str
    date: str
    kind: str


@dataclass(frozen=True)
class Workload:
    tool: str
    dataset: str
    input_len: int | None
    output_len: int | None
    range_ratio: float | None
    max_concurrency: int | None
    request_rate: float | None  # inf: all requests at once (capped by max_concurrency)
    num_prompts: int
    mean_input: float | None  # total tokens / prompts, where the tool printed the totals
    mean_output: float | None
    gsp: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    output_tok_s: float | None  # whole deployment
    ttft_ms: float | None  # median, else mean (`ttft_stat` says which)
    tpot_ms: float | None
    ttft_stat: str
    tpot_stat: str
    accept_length: float | None


@dataclass(frozen=True)
class Case:
    source: Source
    id: str
    kind: str  # throughput | capacity
    sglang_version: str
    gpu: str
    gpus: int
    nodes: int
    model: str
    weights: str
    kv_dtype: str
    tp: int | None
    dp: int
    dp_attention: bool
    ep: int
    mtp: bool
    mtp_steps: int
    accept_length: float | None
    mem_fraction: float | None
    chunked_prefill: int | None
    max_running: int | None
    workload: Workload | None
    published: Published | None
    capacity: dict = field(default_factory=dict)
    uncertain: tuple[str, ...] = ()
    pd: dict = field(default_factory=dict)  # kind disaggregated: the phase measured, its shape and figures (raw)
    recv_interval: int = 1  # --scheduler-recv-interval from other_flags (SGLang's default: 1)
    attention_backend: str | None = None  # --attention-backend from other_flags (None: SGLang's default)

    @property
    def key(self) -> str:
        return f"{self.source.id}/{self.id}"

    @property
    def engine_era(self) -> str:
        """'0.5' for SGLang 0.5.x (what capbench models), 'older' for 0.4.x, 'unknown' when not stated."""
        v = self.sglang_version
        if v.startswith("0.5"):
            return "0.5"
        return "older" if v[:1].isdigit() else "unknown"


def _int(v: object) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _num(v: object) -> float | None:
    if v in (None, "inf"):
        return float("inf") if v == "inf" else None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _stat(p: dict, key: str) -> tuple[float | None, str]:
    d = p.get(key) or {}
    if d.get("median") is not None:
        return float(d["median"]), "median"
    if d.get("mean") is not None:
        return float(d["mean"]), "mean"
    return None, ""


def _workload(w: dict) -> Workload:
    n = _int(w.get("num_prompts")) or 0
    ti, to = _num(w.get("total_input_tokens")), _num(w.get("total_output_tokens"))
    return Workload(tool=str(w.get("tool", "")), dataset=str(w.get("dataset", "")), input_len=_int(w.get("input_len")),
                    output_len=_int(w.get("output_len")), range_ratio=_num(w.get("range_ratio")),
                    max_concurrency=_int(w.get("max_concurrency")), request_rate=_num(w.get("request_rate")),
                    num_prompts=n, mean_input=ti / n if ti and n else None, mean_output=to / n if to and n else None,
                    gsp=dict(w.get("gsp") or {}))


def _published(p: dict, gpus: int) -> Published:
    out = _num(p.get("output_tok_s"))
    if out is None and _num(p.get("output_tok_s_per_gpu")) is not None:
        out = _num(p["output_tok_s_per_gpu"]) * gpus
    ttft, ttft_stat = _stat(p, "ttft_ms")
    tpot, tpot_stat = _stat(p, "tpot_ms")
    return Published(out, ttft, tpot, ttft_stat, tpot_stat, _num(p.get("accept_length")))


def _case(source: Source, c: dict) -> Case:
    mtp = c.get("mtp") or {}
    gpus = _int(c.get("gpus")) or 1
    dp = _int(c.get("dp")) or 1
    dpa = bool(c.get("dp_attention")) and dp > 1
    return Case(
        source=source, id=str(c["id"]), kind=str(c.get("kind", "throughput")),
        sglang_version=str(c.get("sglang_version", "unknown")), gpu=str(c["gpu"]), gpus=gpus,
        nodes=_int(c.get("nodes")) or 1, model=str(c["model"]), weights=str(c.get("weights", "native")),
        kv_dtype=str(c.get("kv_dtype", "bf16")), tp=_int(c.get("tp")), dp=dp if dpa else 1, dp_attention=dpa,
        ep=_int(c.get("ep")) or 1, mtp=bool(mtp.get("enabled")), mtp_steps=_int(mtp.get("steps")) or 0,
        accept_length=_num(mtp.get("accept_length")), mem_fraction=_num(c.get("mem_fraction_static")),
        chunked_prefill=_int(c.get("chunked_prefill_size")), max_running=_int(c.get("max_running_requests")),
        workload=_workload(c["workload"]) if c.get("workload") else None,
        published=_published(c.get("published") or {}, gpus) if c.get("kind", "throughput") != "capacity" else None,
        capacity=dict(c.get("published") or {}) if c.get("kind") == "capacity" else {},
        uncertain=tuple(str(u) for u in c.get("uncertain") or ()),
        pd=dict(c.get("pd") or {}, published=dict(c.get("published") or {})) if c.get("kind") == "disaggregated"
        else {},
        recv_interval=_flag_int(c.get("other_flags"), "--scheduler-recv-interval") or 1,
        attention_backend=_flag(c.get("other_flags"), "--attention-backend"),
    )


def _flag_int(flags: object, name: str) -> int | None:
    """The integer value of `name` in a case's other_flags ("--flag 10" or "--flag=10"), None when absent."""
    v = _flag(flags, name)
    return int(v) if v and v.isdigit() else None


def _flag(flags: object, name: str) -> str | None:
    """The value of `name` in a case's other_flags ("--flag x" or "--flag=x"), None when absent."""
    for flag in flags if isinstance(flags, list) else ():
        m = re.fullmatch(rf"{re.escape(name)}[ =](\S+)", str(flag).strip())
        if m:
            return m.group(1)
    return None


SAFE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it: the same documents, 7x faster


@cache
def load(folder: Path = MEASUREMENTS) -> tuple[Case, ...]:
    cases = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            raw = yaml.load(path.read_text(), Loader=SAFE) or {}
            s = raw["source"]
            source = Source(str(s["id"]), str(s.get("org") or s["id"]), str(s.get("title", "")),
                            str(s.get("url", "")), str(s.get("date", "")), str(s.get("kind", "")))
            cases += [_case(source, c) for c in raw.get("cases") or []]
        except (yaml.YAMLError, KeyError, TypeError, ValueError) as e:
            raise BadInput(f"measurement file {path}: {type(e).__name__}: {e}") from None
    return tuple(cases)


def sources(cases: tuple[Case, ...]) -> dict[str, list[Case]]:
    """Cases by organisation (the independent sources)."""
    out: dict[str, list[Case]] = {}
    for c in cases:
        out.setdefault(c.source.org, []).append(c)
    return out
