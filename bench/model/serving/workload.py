"""Request mixes as the simulator draws them. A workload is one file in data/workloads (the schema and the loader
are loadgen's: `loadgen/workloads.py`), read the same by `capbench simulate`, `capbench run` and the Planner; this
module turns it into simulated requests with the same structure the load test sends:

- synthetic, long_context: a prompt of `input` tokens nobody else shares;
- shared_prefix: one of `groups` system prompts of `system_tokens` (and, with `questions`, one of that many
  questions per group, asked again), then the request's own input;
- multi_turn: `concurrent_sessions` conversations of `turns` turns; a turn resends the conversation so far
  (system prompt, earlier user turns and the client's earlier assistant turns) and adds `input` tokens;
- agentic_coding: one shared system prompt of `system_tokens`, a task of `input` tokens, then per turn an
  assistant tool call (a quarter of an `output` draw) and a tool result (`tool_output` + 40 tokens);
- sharegpt: the file's conversations, ~4 characters a token, answers capped at `max_output_tokens`.
Lengths are drawn from the file's distributions with the simulator's own seeded stream (a load test draws its own
from the same distributions). Requests are never materialised as tokens: a prompt is described by the owners of
its blocks (a system prompt, a question, a conversation, or the request itself), which is all the prefix cache
needs. The answers a server generates are not resent by the load generator, so they are never shared.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

from bench.errors import BadInput
from bench.model.fits.catalog import DATA
from bench.model.serving.run_cache import Runs
from bench.model.serving.scheduler import Request
from loadgen import workloads as lg

WORKLOADS = DATA / "workloads"
Workload = lg.Workload


def load_workload(name_or_path: str) -> Workload:
    """A data/workloads name, a workload YAML path or a ShareGPT JSON path."""
    try:
        wl = lg.load(name_or_path)
        if wl.type == "sharegpt":
            wl.sharegpt_pairs()  # a missing or empty file fails now, not in the middle of a sweep
    except lg.WorkloadError as e:
        raise BadInput(str(e)) from None
    if wl.type == "trace":
        raise BadInput(f"workload {wl.name}: a trace is replayed by `capbench run --profile trace`; the simulator "
                       "needs a workload of lengths")
    return wl


def fixed_workload(input_len: int | str, output_len: int | str) -> Workload:
    """Synthetic prompts and answers of N tokens each, or drawn uniformly from `uniform:A-B`."""
    try:
        return lg.synthetic(str(input_len), str(output_len))
    except lg.WorkloadError as e:
        raise BadInput(str(e)) from None


def names() -> list[str]:
    return [n for n in lg.names() if lg.load(n).type != "trace"]


def draw(lengths: lg.Lengths, rng: random.Random) -> int:
    p, dist = lengths.params, lengths.dist
    if dist == "fixed":
        n = p["value"]
    elif dist == "uniform":
        n = rng.randint(int(p["min"]), int(p["max"]))
    elif dist == "lognormal":
        n = round(rng.lognormvariate(math.log(p["median"]), p["sigma"]))
    elif dist == "normal":
        n = round(rng.gauss(p["mean"], p["std"]))
    else:
        lo, hi, _ = rng.choices(p["bins"], weights=[b[2] for b in p["bins"]])[0]
        n = round(rng.uniform(lo, hi))
    return max(1, max(int(p.get("min", 1)), min(int(p.get("max", 1 << 20)), n)))


def _keys(runs: list[tuple[int, int | None]], block: int) -> Callable[[int], Runs]:
    """Block keys of a sequence made of runs [(end_token, owner), ...]: block i belongs to the owner of its last
    token, keyed owner * 2**24 + i. Position keys are enough: an owner's content at a position never changes.
    A run owned by None is the request's own content: no one else can share it, so it and all after it get no
    keys (they are simply freed at the end, as an unshared radix node would be evicted first)."""

    def keys(n: int) -> Runs:
        out, lo, blocks = [], 0, n // block
        for end, owner in runs:
            hi = min(end // block, blocks)
            if owner is None:
                break
            base = owner << 24
            out.append((base + lo, base + hi))
            lo = hi
            if hi >= blocks:
                break
        return Runs(out)

    return keys


class _Sessions:
    """Conversations as loadgen numbers them (request i -> session, turn), each with its lengths drawn once."""

    def __init__(self, wl: Workload, first_owner: int) -> None:
        self.concurrent = int(wl.options.get("concurrent_sessions", 8))
        self.turns = int(wl.options.get("turns", 4))
        self.first_owner = first_owner
        self.drawn: dict[int, list[int]] = {}
        self.tool = lg.Lengths.parse(wl.options.get("tool_output", lg.DEFAULT_TOOL_OUTPUT))  # agentic_coding's

    def of(self, i: int) -> tuple[int, int]:
        block, r = divmod(i, self.concurrent * self.turns)
        return block * self.concurrent + r % self.concurrent, r // self.concurrent

    def lengths(self, session: int, needed: int, new: Callable[[int], int]) -> list[int]:
        """The session's first `needed` segment lengths; segment k is drawn by new(k) the first time it is needed."""
        got = self.drawn.setdefault(session, [])
        while len(got) < needed:
            got.append(new(len(got)))
        return got[:needed]


def _prompt(wl: Workload, i: int, rng: random.Random, sessions: _Sessions | None,
            sharegpt: list[tuple[str, str]] | None) -> tuple[list[tuple[int, int | None]], int, int]:
    """(runs of the prompt as (end token, owner), prompt tokens, answer tokens) of request i."""
    o = wl.options
    if wl.type in ("synthetic", "long_context"):
        new, answer = draw(wl.input, rng), draw(wl.output, rng)
        return [], new, answer
    if wl.type == "shared_prefix":
        new, answer = draw(wl.input, rng), draw(wl.output, rng)
        groups, system = int(o.get("groups", 8)), int(o.get("system_tokens", 2048))
        g = rng.randrange(groups)
        runs = [(system, 1 + g)]
        if o.get("questions"):  # N system prompts x M questions, asked again and again
            q = (i // groups) % int(o["questions"])
            runs.append((system + new, 1 + groups + g * int(o["questions"]) + q))
        return runs, system + new, answer
    if wl.type == "sharegpt":
        prompt, reply = sharegpt[rng.randrange(len(sharegpt))]
        return [], max(1, len(prompt) // 4), max(1, min(int(o.get("max_output_tokens", 2048)), len(reply) // 4))
    session, turn = sessions.of(i)
    owner = sessions.first_owner + session
    if wl.type == "multi_turn":
        system = int(o.get("system_tokens", 0))
        runs = [(system, 1 + session % int(o.get("groups", 1)))] if system else []
        # segments: user 0, assistant 0, user 1, ...: this turn's prompt ends with user `turn`
        segs = sessions.lengths(session, 2 * turn + 2, lambda k: draw(wl.input if k % 2 == 0 else wl.output, rng))
        prompt = system + sum(segs[:-1])
        return runs + [(prompt, owner)], prompt, segs[-1]
    # agentic_coding: system, task, then (assistant call, tool result) per earlier turn
    system = int(o.get("system_tokens", 4096))
    tool = sessions.tool
    segs = sessions.lengths(session, 1 + turn, lambda k: draw(wl.input, rng) if k == 0 else
                            draw(wl.output, rng) // 4 + draw(tool, rng) + 40)
    prompt = system + sum(segs)
    return [(system, 1), (prompt, owner)], prompt, draw(wl.output, rng)


class _Stream:
    """The requests of one seeded draw, drawn as far as asked and kept: request i and its gap before it (as
    -log(1 - u) of one uniform draw, divided by the rate: random.expovariate's arithmetic) do not depend on the rate
    or on how many come after, so a rate search draws its requests once and each rate only spaces them out."""

    def __init__(self, wl: Workload, seed: int, paced: bool, block: int, context: int) -> None:
        self.wl, self.paced, self.block, self.context = wl, paced, block, context
        self.rng = random.Random(seed)
        groups = int(wl.options.get("groups", 8)) * (1 + int(wl.options.get("questions", 0) or 0))
        self.sessions = _Sessions(wl, 2 + groups) if wl.type in ("multi_turn", "agentic_coding") else None
        self.sharegpt = wl.sharegpt_pairs() if wl.type == "sharegpt" else None
        self.drawn: list[tuple] = []  # (rid, prompt tokens, answer tokens, unit gap, prompt's keys, keys of n tokens)

    def upto(self, n: int) -> list[tuple]:
        for i in range(len(self.drawn), n):
            gap = -math.log(1.0 - self.rng.random()) if self.paced else 0.0
            runs, prompt, answer = _prompt(self.wl, i, self.rng, self.sessions, self.sharegpt)
            prompt = min(prompt, self.context - 1)
            answer = max(1, min(answer, self.context - prompt))
            keys = _keys(runs + [(prompt + answer, None)], self.block)
            self.drawn.append((str(i), prompt, answer, gap, keys(prompt), keys))
        return self.drawn[:n]


_streams: dict[tuple, _Stream] = {}  # every rate of a search and every configuration of a plan: the same requests
STREAMS_KEPT = 8  # the last used draws (a 3,200-request agentic draw is ~2 MB)
_drawing = threading.Lock()


def _forget_in_child() -> None:
    """A fork (the plan's worker pool) may copy a stream another thread was drawing on, and the lock held: the child
    starts with neither."""
    global _drawing
    _drawing = threading.Lock()
    _streams.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def make_requests(wl: Workload, rate: float, n: int, seed: int, block: int, context: int) -> list[Request]:
    """n requests arriving as a Poisson process of `rate` per second (rate <= 0 or inf: all at time 0); fresh
    Request objects each call (a simulation changes them), drawn once per workload, seed, block and context."""
    paced = 0 < rate < math.inf
    key = (json.dumps(wl.to_dict(), sort_keys=True, default=str), seed, paced, block, context)
    with _drawing:  # the dashboard's sessions are threads of one process: a stream is drawn on by one at a time
        stream = _streams[key] = _streams.pop(key, None) or _Stream(wl, seed, paced, block, context)
        while len(_streams) > STREAMS_KEPT:
            del _streams[next(iter(_streams))]  # the least recently used
        drawn = stream.upto(n)
    t, out = 0.0, []
    for rid, prompt, answer, gap, prompt_keys, keys in drawn:
        if paced:
            t += gap / rate
        out.append(Request(rid, prompt, answer, t, prompt_keys, keys))
    return out


def describe(wl: Workload) -> str:
    return f"'{wl.name}'" + (f" ({wl.description})" if wl.description else "")


def workload_path(name: str) -> Path | None:
    path = WORKLOADS / f"{name}.yaml"
    return path if path.is_file() else None
