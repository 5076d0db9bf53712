"""One evaluation: the suites asked of one endpoint, or of two (A and B) on the same problems, answers stored in the
DB beside the run (eval_answers, eval_positions), each suite's data named by version and checksum in the run's
config, and per suite the pass rate with its 90 % interval; with two endpoints the paired difference and the gate
(bench/model/evidence/paired.py)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, field

import httpx
from scipy import stats

from bench.eval import longgen, suites
from bench.eval.answer import Answer
from bench.eval.client import Endpoint
from bench.model import Paired, Verdict, drop_gate, paired_difference
from bench.report import quality

TWIN_NOTE = quality.TWIN_NOTE


@dataclass
class SuiteResult:
    suite: str
    data: dict  # package, version, sha256 (bench/eval/suites.py data_info)
    problems: int
    answers: list[list[Answer]]  # per side, in problem order
    positions: list[dict] = field(default_factory=list)  # long: per prompt and bin (longgen.by_position)
    long_errors: int = 0


def pass_rate(answers: list[Answer]) -> dict:
    """Scored problems, passed, the pass rate in points with its 90 % Wilson interval, endpoint errors, not run,
    and the share of answers whose tool calls did not parse."""
    scored = [a for a in answers if a.scored]
    passed = sum(a.outcome == "passed" for a in scored)
    out = {"scored": len(scored), "passed": passed, "errors": sum(a.outcome == "error" for a in answers),
           "not_run": sum(a.outcome == "not_run" for a in answers),
           "unparsed": sum(a.unparsed for a in scored) / len(scored) if scored else None,
           "pass_rate": 100 * passed / len(scored) if scored else None, "interval": [None, None]}
    if scored:
        ci = stats.binomtest(passed, len(scored)).proportion_ci(0.90, method="wilson")
        out["interval"] = [100 * float(ci.low), 100 * float(ci.high)]
    return out


def compare(r: SuiteResult, max_drop: float) -> tuple[Paired, Verdict] | None:
    """B against A on the problems both scored (an error or a not-run on either side leaves the problem out)."""
    if len(r.answers) != 2 or r.suite not in suites.SCORED:
        return None
    both = [(a, b) for a, b in zip(*r.answers, strict=True) if a.scored and b.scored]
    p = paired_difference([a.outcome == "passed" for a, _ in both], [b.outcome == "passed" for _, b in both])
    return p, drop_gate(p, max_drop)


async def _suite(client: httpx.AsyncClient, eps: list[Endpoint], suite: str, limit: int | None, seed: int,
                 concurrency: int, progress, ignore_eos: bool) -> SuiteResult:
    items, _ = suites.problems(suite, limit, seed)
    sem = asyncio.Semaphore(concurrency)
    cores = asyncio.Semaphore(os.cpu_count() or 1)
    result = SuiteResult(suite, suites.data_info(suite), len(items), [[] for _ in eps])
    if suite == "long":
        async def one_long(p: dict) -> list[dict] | None:
            async with sem:
                a, b = await asyncio.gather(*(longgen.ask_long(client, ep, p, seed, ignore_eos) for ep in eps))
            progress()
            return None if a.error or b.error else longgen.by_position(p["id"], a, b)

        rows = await asyncio.gather(*(one_long(p) for p in items))
        result.positions = [r for rs in rows if rs for r in rs]
        result.long_errors = sum(rs is None for rs in rows)
        return result
    solve = suites.solver(suite)

    async def one(p: dict) -> list[Answer]:
        async with sem:
            got = await asyncio.gather(*(solve(client, ep, p, seed, cores) for ep in eps))
        progress()
        return got

    for got in await asyncio.gather(*(one(p) for p in items)):
        for side, answer in enumerate(got):
            result.answers[side].append(answer)
    return result


def evaluate(eps: list[Endpoint], names: list[str], limit: int | None = None, seed: int = 0, concurrency: int = 4,
             progress=lambda: None, ignore_eos: bool = False) -> list[SuiteResult]:
    """Every suite in turn, its problems `concurrency` at a time, each problem asked of every endpoint at once."""
    if "long" in names and len(eps) != 2:
        from bench.errors import BadInput

        raise BadInput("the long suite compares two endpoints: give two --target options")

    async def go() -> list[SuiteResult]:
        async with httpx.AsyncClient() as client:
            return [await _suite(client, eps, s, limit, seed, concurrency, progress, ignore_eos) for s in names]

    return asyncio.run(go())


def answer_rows(run_id: str, targets: list[str], results: list[SuiteResult]) -> list[dict]:
    return [{"run_id": run_id, "side": "AB"[side], "target": targets[side], "suite": a.suite,
             "problem_id": a.problem_id, "outcome": a.outcome, "unparsed": a.unparsed, "answer": a.text,
             "detail": a.detail, "latency_s": a.latency_s, "completion_tokens": a.completion_tokens}
            for r in results for side, answers in enumerate(r.answers) for a in answers]


def position_rows(run_id: str, results: list[SuiteResult]) -> list[dict]:
    return [{"run_id": run_id, **row} for r in results for row in r.positions]


def summary(results: list[SuiteResult], max_drop: float) -> list[dict]:
    """Per suite: its data, each side's pass rate, and with two sides the paired difference and the gate."""
    out = []
    for r in results:
        s = {"suite": r.suite, "name": suites.NAMES[r.suite], "data": r.data, "problems": r.problems,
             "sides": [pass_rate(a) for a in r.answers] if r.suite != "long" else []}
        if r.suite == "long":
            s["positions"] = longgen.position_table(r.positions)
            s["errors"] = r.long_errors
        ab = compare(r, max_drop)
        if ab:
            p, v = ab
            s["paired"] = {**asdict(p), "said": p.said()}
            s["gate"] = {"max_drop": max_drop, **asdict(v)}
        out.append(s)
    return out
