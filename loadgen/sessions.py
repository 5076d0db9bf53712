"""Multi-turn and agentic sessions.

Closed loop (a session workload's default, `loop: closed`): a session starts at every `turns`-th of the
profile's arrivals (the profile's rate stays a rate of requests; see arrivals()), or when a `users` profile's
user is free; its turn N+1 is sent only after turn N's last token, plus a think time
(`think_s`: seconds, or {dist: fixed|uniform|lognormal, ...}), and carries turn N's real answer in its history
(an agentic session also a tool call and the tool's output, made up: the server runs no tools). Each request's
row has its session id and turn, so TTFT and prefix-cache hits can be read by turn (bench/store/queries.by_turn).
A turn that fails ends its session (there is no answer to carry on with).

Open loop (`loop: open`): request i is turn i // concurrent_sessions of one of `concurrent_sessions` interleaved
sessions, sent on the profile's schedule; earlier answers are seeded text of the drawn length.
"""

from __future__ import annotations

import json
import math
import random
from typing import Protocol

from loadgen.prompts import _WORDS, DEFAULT_TOOL_OUTPUT, Lengths, RequestSpec, WorkloadError, seeded, text


class Workload(Protocol):
    """What a session reads of its workload (loadgen/workloads.py's Workload, which builds its sessions here)."""

    name: str
    type: str
    seed: int
    options: dict
    input: Lengths
    output: Lengths

    @property
    def closed_loop(self) -> bool: ...

    @property
    def session_turns(self) -> int: ...

    def _spec(self, messages: list[dict], max_tokens: int, input_tokens: int, extra: dict | None = None
              ) -> RequestSpec: ...

TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, desc, arg in (("read_file", "Read a file of the repository.", "path"),
                            ("edit_file", "Replace a file's contents.", "path"),
                            ("run", "Run a shell command in the repository.", "command"))
]


def think_time(spec: object) -> tuple[str, dict]:
    """A think-time spec: seconds, or {dist: fixed|uniform|lognormal, ...}; WorkloadError when it cannot be used."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        spec = {"dist": "fixed", "value": spec}
    need = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("median", "sigma")}
    if not isinstance(spec, dict) or spec.get("dist") not in need or any(k not in spec for k in need[spec["dist"]]):
        raise WorkloadError(f"think_s is seconds or {{dist: fixed|uniform|lognormal, ...}}, not {spec!r}")
    params = {k: v for k, v in spec.items() if k != "dist"}
    for k, v in params.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= 3600:
            raise WorkloadError(f"think_s {k}: {v!r} is not a number of seconds in [0, 3600]")
    return spec["dist"], params


def _think(spec: tuple[str, dict], rng: random.Random) -> float:
    dist, p = spec
    if dist == "fixed":
        return float(p["value"])
    if dist == "uniform":
        return rng.uniform(p["min"], p["max"])
    return min(3600.0, math.exp(rng.gauss(math.log(max(p["median"], 1e-6)), p["sigma"])))


def _tool_call(rng: random.Random, session: int, turn: int) -> dict:
    tool = rng.choice(TOOLS)["function"]["name"]
    args = json.dumps({"path": f"src/{rng.choice(_WORDS)}_{turn}.py"} if tool != "run" else
                      {"command": f"pytest -q tests/test_{rng.choice(_WORDS)}.py"})
    return {"id": f"call_{session}_{turn}", "type": "function", "function": {"name": tool, "arguments": args}}


class Session:
    """One session, turn by turn: request() is the current turn; answered(text, tokens) adds the real answer (and,
    agentic, a tool call and its output) and the next turn's new message."""

    def __init__(self, wl: Workload, index: int):
        self.wl, self.index = wl, index
        self.rng = seeded(wl.seed, wl.name, "session", index)
        self.turns = int(wl.options.get("turns", 4))
        self.think = think_time(wl.options.get("think_s", 0.0))
        self.turn = 0
        self.agentic = wl.type == "agentic_coding"
        self.messages: list[dict] = []
        self.tokens = 0
        if self.agentic:
            sys_len = int(wl.options.get("system_tokens", 4096))
            self._add("system", text(seeded(wl.seed, wl.name, "system"), sys_len), sys_len)
        elif wl.options.get("system_tokens"):  # a shared system prompt per group of sessions
            sys_len = int(wl.options["system_tokens"])
            g = index % int(wl.options.get("groups", 1))
            self._add("system", text(seeded(wl.seed, wl.name, "system", g), sys_len), sys_len)
        n = wl.input.sample(self.rng)
        self._add("user", text(self.rng, n), n)
        self.tool_out = Lengths.parse(wl.options.get("tool_output", DEFAULT_TOOL_OUTPUT))

    def _add(self, role: str, content: str, tokens: int, **extra) -> None:
        self.messages.append({"role": role, "content": content, **extra})
        self.tokens += tokens

    def request(self) -> RequestSpec:
        return self.wl._spec([dict(m) for m in self.messages], self.wl.output.sample(self.rng), self.tokens,
                             {"tools": TOOLS} if self.agentic else None)

    def answered(self, answer: str, tokens: int | None) -> bool:
        """Turn N's answer is in; False when the session is over (no turn N+1)."""
        self.turn += 1
        if self.turn >= self.turns:
            return False
        tokens = tokens or max(1, len(answer.split()))
        if self.agentic:
            call = _tool_call(self.rng, self.index, self.turn - 1)
            self._add("assistant", answer, tokens, tool_calls=[call])
            out = self.tool_out.sample(self.rng)
            self._add("tool", text(self.rng, out), out + 40, tool_call_id=call["id"])
        else:
            self._add("assistant", answer, tokens)
            n = self.wl.input.sample(self.rng)
            self._add("user", text(self.rng, n), n)
        return True

    def think_s(self) -> float:
        return _think(self.think, self.rng)


def arrivals(offsets, wl: Workload, replayed: bool = False):
    """Closed loop: a session starts at every `turns`-th arrival of the profile, so that the profile's rate stays
    the rate of requests (as the planner and campaigns read it) when every turn is answered without think time;
    the sessions' own pace (answers, think time) decides the rest. Open loop: every arrival is a request.
    replayed: the arrivals are a prompt file's own timestamps, one a session already."""
    return offsets[:: wl.session_turns] if wl.closed_loop and not replayed else offsets


def _interleaved(wl: Workload, i: int) -> tuple[int, int]:
    """Open loop: request i -> (session, turn). `concurrent_sessions` sessions interleaved, each sent turn by turn."""
    c, turns = int(wl.options.get("concurrent_sessions", 8)), int(wl.options.get("turns", 4))
    block, r = divmod(i, c * turns)
    return block * c + r % c, r // c


def open_loop_request(wl: Workload, i: int) -> RequestSpec:
    """Open loop: request i, with every earlier answer of its session made up (seeded text of the drawn length)."""
    session, turn = _interleaved(wl, i)
    srng = seeded(wl.seed, wl.name, "session", session)
    messages, total = [], 0
    if wl.type == "agentic_coding":
        sys_len = int(wl.options.get("system_tokens", 4096))
        tool_out = Lengths.parse(wl.options.get("tool_output", DEFAULT_TOOL_OUTPUT))
        task = wl.input.sample(srng)
        messages = [{"role": "system", "content": text(seeded(wl.seed, wl.name, "system"), sys_len)},
                    {"role": "user", "content": text(srng, task)}]
        total = sys_len + task
        for k in range(turn):
            call = _tool_call(srng, session, k)
            messages.append({"role": "assistant", "content": text(srng, wl.output.sample(srng) // 4),
                             "tool_calls": [call]})
            out = tool_out.sample(srng)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text(srng, out)})
            total += out + 40
        return wl._spec(messages, wl.output.sample(srng), total, {"tools": TOOLS})
    if wl.options.get("system_tokens"):  # a shared system prompt per group of sessions
        sys_len = int(wl.options["system_tokens"])
        g = session % int(wl.options.get("groups", 1))
        messages.append({"role": "system", "content": text(seeded(wl.seed, wl.name, "system", g), sys_len)})
        total += sys_len
    for k in range(turn + 1):
        n = wl.input.sample(srng)
        messages.append({"role": "user", "content": text(srng, n)})
        total += n
        answer = wl.output.sample(srng)
        if k < turn:
            messages.append({"role": "assistant", "content": text(srng, answer)})
            total += answer
    return wl._spec(messages, answer, total)
