"""The suites `capbench eval` runs, by name: where each one's problems come from, and who answers and scores one."""

from __future__ import annotations

from bench.errors import BadInput
from bench.eval import bfcl, humaneval, longgen

SCORED = ("humaneval", *bfcl.CATEGORIES, "retrieval")  # a pass or a failure per problem and endpoint
SUITES = (*SCORED, "long")  # long: two endpoints' answers compared by position, no pass or failure
NAMES = {"humaneval": "HumanEval", "bfcl-simple": "BFCL simple", "bfcl-multiple": "BFCL multiple",
         "bfcl-parallel": "BFCL parallel", "bfcl-multi-turn": "BFCL multi-turn", "retrieval": "retrieval 32k-120k",
         "long": "long generations"}


def parse(text: str) -> list[str]:
    """`humaneval,bfcl-simple` -> the suites in that order; `all` -> every scored suite; `bfcl` -> its four."""
    out: list[str] = []
    for name in (s.strip() for s in text.split(",") if s.strip()):
        group = {"all": SCORED, "bfcl": tuple(bfcl.CATEGORIES)}.get(name, (name,))
        for s in group:
            if s not in SUITES:
                raise BadInput(f"unknown suite {s!r} (known: {', '.join(SUITES)}, all, bfcl)")
            if s not in out:
                out.append(s)
    if not out:
        raise BadInput("--suite names no suite")
    return out


def problems(suite: str, limit: int | None, seed: int) -> tuple[list[dict], str]:
    """The suite's problems (all, or `limit` drawn with `seed`) and the key of their ids."""
    if suite == "humaneval":
        return humaneval.problems(limit, seed), "task_id"
    if suite in bfcl.CATEGORIES:
        return bfcl.problems(suite, limit, seed), "id"
    if suite == "retrieval":
        return longgen.retrieval_problems(limit, seed), "id"
    return longgen.long_prompts(limit, seed), "id"


def data_info(suite: str) -> dict:
    """The suite's data: package, version and the data file's SHA-256 (built problems: their digest)."""
    if suite == "humaneval":
        return humaneval.source().info()
    if suite in bfcl.CATEGORIES:
        return bfcl.source(suite).info()
    if suite == "retrieval":
        return {"package": "capbench", "built": "bench/eval/longgen.py", "seed": longgen.SEED,
                "sha256": longgen.retrieval_digest()}
    from bench.drift_prompts import DRIFT_PROMPTS
    from bench.eval.data import sha256

    return {"package": "capbench", "file": DRIFT_PROMPTS.name, "sha256": sha256(str(DRIFT_PROMPTS))}


def solver(suite: str):
    if suite == "humaneval":
        return humaneval.solve
    if suite in bfcl.CATEGORIES:
        return bfcl.solve
    return longgen.solve_retrieval
