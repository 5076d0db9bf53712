"""Tool calls: BFCL v4 from the installed `bfcl-eval` package (its questions, functions and possible answers), asked
through the OpenAI tools API and scored by the package's own checkers: the AST checker for simple, multiple and
parallel, the state checker for multi-turn (which executes the calls against its simulated file system, trading
bot, ... classes). The model's calls are data until a checker runs them, and every checker runs in the sandbox
(the multi-turn one `eval`s the call strings). A call whose arguments are not JSON is a failure and is also
counted apart (`unparsed`); an endpoint error is neither.

The checkers import `bfcl_eval.constants.model_config`, which imports every provider's SDK (anthropic, cohere,
google-genai, ...) that capbench does not install; the AST checker reads one flag from it, `underscore_to_dot`
(names sent through OpenAI's tools API cannot hold "."; the package replaces them with "_", as we do), so the
sandboxed checker is given a module holding that one flag for the model it checks.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path

from bench.eval import data, sandbox
from bench.eval.answer import Answer, cut
from bench.eval.client import chat

CATEGORIES = {"bfcl-simple": "simple_python", "bfcl-multiple": "multiple", "bfcl-parallel": "parallel",
              "bfcl-multi-turn": "multi_turn_base"}
MAX_TOKENS = 1024
MAX_STEPS = 20  # per turn of a multi-turn problem, as BFCL's own runner
LIMITS = sandbox.Limits(cpu_s=20, wall_s=60, memory_mb=1024)
TURNS_LIMITS = sandbox.Limits(cpu_s=60, wall_s=3600, memory_mb=1024)  # lives while the model answers each step
CHECKED_AS = "capbench"  # the model name the checkers see
SHIM = f'''import sys, json, types
from dataclasses import dataclass
sys.path.insert(0, {{site!r}})
shim = types.ModuleType("bfcl_eval.constants.model_config")
@dataclass
class ModelConfig:
    underscore_to_dot: bool = True
shim.MODEL_CONFIG_MAPPING = {{{{{CHECKED_AS!r}: ModelConfig()}}}}
sys.modules["bfcl_eval.constants.model_config"] = shim
'''
AST_CHECK = '''from bfcl_eval.constants.enums import Language
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
job = json.loads(sys.stdin.read())
r = ast_checker(job["functions"], job["output"], job["answer"], Language.PYTHON, job["category"], job["model"])
print(json.dumps({"valid": bool(r["valid"]), "error": str(r.get("error", ""))[:300]}))
'''
MULTI_TURN = '''from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
entry = json.loads(sys.stdin.readline())
for line in sys.stdin:
    job = json.loads(line)
    if job["op"] == "execute":
        out, _ = execute_multi_turn_func_call(job["calls"], entry["initial_config"], entry["involved_classes"],
                                              job["model"], entry["id"])
        print(json.dumps([str(x)[:4000] for x in out]), flush=True)
    else:
        r = multi_turn_checker(job["decoded"], job["ground_truth"], entry, "multi_turn_base", job["model"])
        print(json.dumps({"valid": bool(r["valid"]), "error": str(r.get("error_message", ""))[:300]}), flush=True)
        break
'''


def _root() -> Path:
    try:
        import bfcl_eval
    except ImportError:
        from bench.errors import BadInput

        raise BadInput("the bfcl-eval package is not installed (pip install --no-deps bfcl-eval: its data and "
                       "checkers are the suite's)") from None
    return Path(bfcl_eval.__file__).parent


def _site() -> str:
    return str(_root().parent)


def source(suite: str) -> data.Source:
    return data.Source(suite, "bfcl-eval", _root() / "data" / f"BFCL_v4_{CATEGORIES[suite]}.json")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def problems(suite: str, limit: int | None, seed: int) -> list[dict]:
    category = CATEGORIES[suite]
    root = _root() / "data"
    answers = {a["id"]: a["ground_truth"] for a in _lines(root / "possible_answer" / f"BFCL_v4_{category}.json")}
    items = [{**q, "ground_truth": answers[q["id"]], "category": category} for q in
             _lines(root / f"BFCL_v4_{category}.json") if q["id"] in answers]
    if category == "multi_turn_base":
        from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

        for q in items:
            docs = [f for c in q["involved_classes"] for f in _lines(
                root / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[c])]
            q["function"] = [f for f in docs if f["name"] not in q.get("excluded_function", [])]
    return data.pick(items, "id", limit, seed)


def tools_of(functions: list[dict]) -> list[dict]:
    """BFCL's function documents as OpenAI tools: '.' in names as '_', BFCL's types as JSON Schema's."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as TYPES

    def cast(props: dict) -> dict:
        for p in props.values():
            p["type"] = TYPES.get(p.get("type", "string"), "string")
            if "properties" in p:
                cast(p["properties"])
            if isinstance(p.get("items"), dict):
                cast({"_": p["items"]})
        return props

    out = []
    for f in copy.deepcopy(functions):
        params = f.get("parameters") or {"properties": {}}
        params["type"] = "object"
        params["properties"] = cast(params.get("properties") or {})
        out.append({"type": "function", "function": {"name": f["name"].replace(".", "_"),
                                                     "description": f.get("description", ""), "parameters": params}})
    return out


def decode(tool_calls: list[dict]) -> tuple[list[dict], int]:
    """The calls as BFCL's checkers take them ([{name: {arg: value}}]) and how many did not parse."""
    calls, unparsed = [], 0
    for c in tool_calls:
        try:
            args = json.loads(c["function"].get("arguments") or "{}")
            if not isinstance(args, dict):
                raise ValueError
        except (ValueError, TypeError):
            unparsed += 1
            continue
        calls.append({c["function"]["name"]: args})
    return calls, unparsed


def call_string(call: dict) -> str:
    """One decoded call as the multi-turn checker executes it: name(arg=repr(value), ...)."""
    (name, args), = call.items()
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def _checked(out: sandbox.Outcome) -> tuple[str, str]:
    if out.status == "not_run":
        return "not_run", out.detail
    try:
        verdict = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        if out.detail.startswith(("ModuleNotFoundError", "ImportError")):  # the checker's fault, not the answer's
            return "not_run", f"checker could not run: {out.detail}"
        return "failed", f"checker: {out.status}: {out.detail}"
    return ("passed" if verdict["valid"] else "failed"), verdict.get("error", "")


async def solve(client, ep, problem: dict, seed: int, gate: asyncio.Semaphore) -> Answer:
    suite = next(s for s, c in CATEGORIES.items() if c == problem["category"])
    if problem["category"] == "multi_turn_base":
        return await _multi_turn(client, ep, problem, seed, suite)
    began = time.monotonic()
    reply = await chat(client, ep, problem["question"][0], MAX_TOKENS, seed, tools=tools_of(problem["function"]))
    latency = time.monotonic() - began
    if reply.error:
        return Answer(suite, problem["id"], "error", detail=reply.error, latency_s=latency)
    calls, unparsed = decode(reply.tool_calls)
    text = cut(json.dumps(reply.tool_calls) if reply.tool_calls else reply.content)
    if unparsed:
        return Answer(suite, problem["id"], "failed", True, text, f"{unparsed} call(s) did not parse", latency,
                      reply.completion_tokens)
    job = {"functions": problem["function"], "output": calls, "answer": problem["ground_truth"],
           "category": problem["category"], "model": CHECKED_AS}
    async with gate:
        out = await asyncio.to_thread(sandbox.run, SHIM.format(site=_site()) + AST_CHECK, (_site(),), LIMITS,
                                      json.dumps(job))
    outcome, detail = _checked(out)
    return Answer(suite, problem["id"], outcome, False, text, detail, latency, reply.completion_tokens)


async def _multi_turn(client, ep, problem: dict, seed: int, suite: str) -> Answer:
    """Turn by turn: the model calls tools until it answers in words (at most MAX_STEPS), each call executed by the
    package's classes in one sandboxed process that lives for the problem; then its state checker."""
    if (why := sandbox.why_not()) is not None:
        return Answer(suite, problem["id"], "not_run", detail=why)
    began, tools, messages, decoded, unparsed = time.monotonic(), tools_of(problem["function"]), [], [], 0
    proc = await asyncio.to_thread(sandbox.start, SHIM.format(site=_site()) + MULTI_TURN, (_site(),), TURNS_LIMITS)

    def ask_jail(job: dict, answer: bool = True) -> object:
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()
            line = proc.stdout.readline() if answer else b"null"
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    try:
        await asyncio.to_thread(ask_jail, {k: problem[k] for k in ("id", "initial_config", "involved_classes")},
                                False)
        for turn in problem["question"]:
            messages += turn
            steps = []
            for _ in range(MAX_STEPS):
                reply = await chat(client, ep, messages, MAX_TOKENS, seed, tools=tools)
                if reply.error:
                    return Answer(suite, problem["id"], "error", detail=reply.error,
                                  latency_s=time.monotonic() - began)
                if not reply.tool_calls:
                    messages.append({"role": "assistant", "content": reply.content})
                    break
                calls, bad = decode(reply.tool_calls)
                unparsed += bad
                strings = [call_string(c) for c in calls]
                results = await asyncio.to_thread(ask_jail, {"op": "execute", "calls": strings, "model": CHECKED_AS})
                if results is None:
                    return Answer(suite, problem["id"], "failed", unparsed > 0, cut(json.dumps(decoded)),
                                  "the tools' process ended", time.monotonic() - began)
                steps.append(strings)
                messages.append({"role": "assistant", "content": reply.content or None,
                                 "tool_calls": reply.tool_calls})
                done = iter(results)
                for c in reply.tool_calls:
                    parsed = decode([c])[0]
                    messages.append({"role": "tool", "tool_call_id": c.get("id", ""),
                                     "content": next(done, "") if parsed else "Error: the arguments are not JSON"})
            decoded.append(steps)
        verdict = await asyncio.to_thread(ask_jail, {"op": "check", "decoded": decoded,
                                                     "ground_truth": problem["ground_truth"], "model": CHECKED_AS})
    finally:
        await asyncio.to_thread(sandbox.stop, proc)
    if verdict is None:
        return Answer(suite, problem["id"], "failed", unparsed > 0, cut(json.dumps(decoded)), "checker ended",
                      time.monotonic() - began)
    return Answer(suite, problem["id"], "passed" if verdict["valid"] and not unparsed else "failed", unparsed > 0,
                  cut(json.dumps(decoded)), "" if verdict["valid"] else verdict["error"], time.monotonic() - began)
