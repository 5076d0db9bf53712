"""Quality drift between two servers (say BF16-KV and FP8-KV): the same prompts, greedy, with top logprobs.

Per prompt: token agreement (positions where both chose the same token, over the longer answer), the first
divergence (first position where the tokens differ or one answer ended; None when identical), and the mean KL
divergence KL(A || B) of the two top-k distributions over the positions before the first divergence: past it the
two contexts differ and a KL would compare unlike things. Top-k lists are not whole distributions: a token missing
from one side's list gets that side's smallest listed probability (an upper bound on any unlisted token), then
both sides are renormalised over the union. The KL is therefore an estimate of the head of the distribution.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.checks import check_target
from bench.drift_prompts import DRIFT_PROMPTS
from bench.errors import BadInput

TOP_LOGPROBS = 5
FAMILIES = ("kimi", "glm", "deepseek", "qwen")  # matched in the served model name


def family_of(model: str) -> str:
    """The model family a served model name belongs to (its report and gate are per family and kind)."""
    name = model.lower()
    return next((f for f in FAMILIES if f in name), "other")


@dataclass
class Gate:
    """Rollout thresholds, each applied to every prompt kind and to 'all'; None: not checked."""

    max_mean_kl: float | None = None
    min_token_agreement: float | None = None
    min_exact_match: float | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    def failures(self, summary: list[dict]) -> list[str]:
        out = []
        for s in summary:
            where = f"{s['family']}/{s['kind']}"
            if s["errors"]:
                out.append(f"{where}: {s['errors']} prompts failed")
            checks = (("mean_kl", self.max_mean_kl, lambda v, t: v <= t, ">"),
                      ("token_agreement", self.min_token_agreement, lambda v, t: v >= t, "<"),
                      ("exact_match", self.min_exact_match, lambda v, t: v >= t, "<"))
            for key, threshold, ok, sign in checks:
                if threshold is not None and s[key] is not None and not ok(s[key], threshold):
                    out.append(f"{where}: {key} {s[key]:.4g} {sign} {threshold:g}")
        return out


@dataclass
class Answer:
    tokens: list[str] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)  # per position: token -> logprob
    tool_calls: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class PromptDrift:
    prompt_id: str
    kind: str
    tokens_a: int
    tokens_b: int
    token_agreement: float
    first_divergence: int | None
    mean_kl: float | None
    exact_match: bool
    tool_calls_match: bool | None
    error: str | None = None


def load_prompts(paths: list[Path] | None) -> list[dict]:
    prompts = []
    for path in paths or [DRIFT_PROMPTS]:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            raise BadInput(f"prompts file not readable: {path}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
                if not isinstance(p.get("messages"), list):
                    raise ValueError
            except (ValueError, AttributeError):
                raise BadInput(f"{path}:{n}: expected a JSON object with 'messages'") from None
            p.setdefault("id", f"{Path(path).stem}-{n}")
            p.setdefault("kind", "chat")
            prompts.append(p)
    if not prompts:
        raise BadInput("no prompts to send")
    return prompts


def kl_topk(p_top: dict[str, float], q_top: dict[str, float]) -> float:
    """KL(P || Q) in nats over the union of two top-k logprob maps (see the module docstring)."""
    if not p_top or not q_top:
        return float("nan")
    p_floor, q_floor = min(p_top.values()), min(q_top.values())
    union = set(p_top) | set(q_top)
    p = {t: math.exp(p_top.get(t, p_floor)) for t in union}
    q = {t: math.exp(q_top.get(t, q_floor)) for t in union}
    zp, zq = sum(p.values()), sum(q.values())
    return sum(p[t] / zp * math.log((p[t] / zp) / (q[t] / zq)) for t in union)


def compare(prompt: dict, a: Answer, b: Answer) -> PromptDrift:
    if a.error or b.error:
        return PromptDrift(prompt["id"], prompt["kind"], len(a.tokens), len(b.tokens), 0.0, None, None, False,
                           None, error=a.error or b.error)
    longest = max(len(a.tokens), len(b.tokens))
    same = sum(1 for x, y in zip(a.tokens, b.tokens, strict=False) if x == y)
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None)
    if first is None and len(a.tokens) != len(b.tokens):
        first = min(len(a.tokens), len(b.tokens))
    shared = first if first is not None else longest
    kls = [kl_topk(a.top[i], b.top[i]) for i in range(min(shared, len(a.top), len(b.top)))]
    kls = [k for k in kls if not math.isnan(k)]
    calls = None
    if a.tool_calls or b.tool_calls:
        calls = [c.get("function") for c in a.tool_calls] == [c.get("function") for c in b.tool_calls]
    return PromptDrift(prompt["id"], prompt["kind"], len(a.tokens), len(b.tokens),
                       same / longest if longest else 1.0, first, statistics.fmean(kls) if kls else None,
                       first is None, calls)


def _answer(body: dict) -> Answer:
    choice = body["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    return Answer(tokens=[c["token"] for c in content],
                  top=[{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} or {c["token"]: c["logprob"]}
                       for c in content],
                  tool_calls=(choice.get("message") or {}).get("tool_calls") or [])


async def _ask(client: httpx.AsyncClient, url: str, model: str, prompt: dict, headers: dict) -> Answer:
    body = {"model": model, "messages": prompt["messages"], "temperature": 0, "stream": False,
            "max_tokens": prompt.get("max_tokens", 64), "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    if prompt.get("tools"):
        body["tools"] = prompt["tools"]
    try:
        r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            return Answer(error=f"http_{r.status_code}")
        return _answer(r.json())
    except httpx.HTTPError as e:
        return Answer(error=type(e).__name__)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Answer(error="malformed_response")


async def _ask_all(targets: list[tuple[str, str]], prompts: list[dict], headers: dict, concurrency: int,
                   progress) -> list[tuple[Answer, Answer]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10)) as client:
        async def one(prompt: dict) -> tuple[Answer, Answer]:
            async with sem:
                pair = await asyncio.gather(*(_ask(client, url, model, prompt, headers) for url, model in targets))
            progress()
            return pair[0], pair[1]

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def measure(targets: list[tuple[str, str]], prompts: list[dict], api_key_env: str | None = None,
            concurrency: int = 8, progress=lambda: None) -> list[PromptDrift]:
    """targets: [(base_url, model)] x 2. The API key is read from the named environment variable only."""
    if concurrency < 1:
        raise BadInput(f"--concurrency must be >= 1, not {concurrency}")
    headers = {"Authorization": f"Bearer {os.environ.get(api_key_env, '')}"} if api_key_env else {}
    answers = asyncio.run(_ask_all(targets, prompts, headers, concurrency, progress))
    return [compare(p, a, b) for p, (a, b) in zip(prompts, answers, strict=True)]


def by_kind(rows: list[PromptDrift], family: str = "other") -> list[dict]:
    """One line per prompt kind (and 'all') of one model family: prompts, exact-match share, mean agreement,
    median first divergence, mean KL, errors."""
    out = []
    kinds = sorted({r.kind for r in rows})
    for kind in [*kinds, "all"]:
        group = [r for r in rows if kind in ("all", r.kind)]
        ok = [r for r in group if r.error is None]
        divs = [r.first_divergence for r in ok if r.first_divergence is not None]
        kls = [r.mean_kl for r in ok if r.mean_kl is not None]
        out.append({
            "family": family, "kind": kind, "prompts": len(group), "errors": len(group) - len(ok),
            "exact_match": sum(r.exact_match for r in ok) / len(ok) if ok else None,
            "token_agreement": statistics.fmean(r.token_agreement for r in ok) if ok else None,
            "median_first_divergence": statistics.median(divs) if divs else None,
            "mean_kl": statistics.fmean(kls) if kls else None,
        })
    return out


def rows_for_store(run_id: str, target_a: str, target_b: str, rows: list[PromptDrift]) -> list[dict]:
    return [{"run_id": run_id, "target_a": target_a, "target_b": target_b, **asdict(r)} for r in rows]


def drift_command(targets: list[str], prompt_files: list[Path] | None, db: Path, label: str,
                  model: str | None, api_key_env: str | None, concurrency: int, as_json: bool,
                  gate: Gate | None = None) -> tuple[str, list[str]]:
    """`capbench drift`: start twin targets if asked, measure, store one run with a drift row per prompt, print.
    Returns the run id and the gate's failures (empty when it passes or no threshold was given)."""
    gate = gate if gate and gate.active else None
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from bench.runner import Target, discover_model
    from bench.store import Store

    if len(targets) != 2:
        raise BadInput("capbench drift takes exactly two --target options (A and B)")
    for spec in targets:
        if not spec.startswith("twin:"):
            check_target(spec)
    prompts = load_prompts(prompt_files)
    store = Store(db)
    opened: list[Target] = []
    try:
        for spec in targets:
            opened.append(Target(spec))
        pairs = [(t.url, model or discover_model(t.url, api_key_env)) for t in opened]
        family = family_of(pairs[0][1])
        run_id = store.start_run(label=label or "drift", target=" vs ".join(targets), profile="drift",
                                 config={"kind": "drift", "targets": targets, "models": [m for _, m in pairs],
                                         "family": family, "gate": asdict(gate) if gate else None,
                                         "prompts": [str(p) for p in (prompt_files or [DRIFT_PROMPTS])],
                                         "top_logprobs": TOP_LOGPROBS})
        try:
            with Progress(transient=True, disable=as_json) as bar:
                task = bar.add_task("prompts", total=len(prompts))
                rows = measure(pairs, prompts, api_key_env, concurrency, lambda: bar.advance(task))
            store.add_drift(rows_for_store(run_id, targets[0], targets[1], rows))
        except BaseException:
            store.finish_run(run_id, "aborted")
            raise
        if rows and all(r.error for r in rows):  # nothing was compared: not a drift of 0
            store.finish_run(run_id, "failed")
            raise BadInput(f"all {len(rows)} prompts failed (first: {rows[0].error}); is each --target serving?")
        store.finish_run(run_id, "completed")
    finally:
        for t in opened:
            t.close()
    summary = by_kind(rows, family)
    failures = gate.failures(summary) if gate else []
    if as_json:
        print(json.dumps({"run_id": run_id, "family": family, "by_kind": summary,
                          "gate": {"thresholds": asdict(gate), "passed": not failures, "failures": failures}
                          if gate else None}, indent=2))
        return run_id, failures
    table = Table(title=f"quality drift ({family}), A = {targets[0]}  B = {targets[1]}  (run {run_id})")
    for col in ("kind", "prompts", "errors", "exact match", "token agreement", "median first divergence",
                "mean KL (nats)"):
        table.add_column(col, justify="left" if col == "kind" else "right")

    def fmt(v, pattern: str) -> str:
        return "-" if v is None else pattern.format(v)

    for s in summary:
        table.add_row(s["kind"], str(s["prompts"]), str(s["errors"]), fmt(s["exact_match"], "{:.0%}"),
                      fmt(s["token_agreement"], "{:.1%}"), fmt(s["median_first_divergence"], "{:.0f}"),
                      fmt(s["mean_kl"], "{:.4f}"))
    console = Console(width=max(Console().width, 120))
    console.print(table)
    if gate:
        console.print("gate: passed" if not failures else "gate: FAILED\n  " + "\n  ".join(failures))
    return run_id, failures
