"""Request mixes for `capbench simulate`: length distributions and prefix sharing, read from data/workloads/*.yaml.

Schema (every key but name, input_len and output_len is optional):
    name: chat
    description: "..."
    input_len:  {lognormal: {median: 300, sigma: 0.9}, min: 8, max: 8192}   # new input tokens per request
    output_len: {fixed: 256} | {uniform: [LO, HI]} | {lognormal: {...}}    # answer tokens per request
    system_prompt: {groups: 8, tokens: 1200}     # each request starts with one of 8 shared 1200-token prompts
    sessions: {count: 32, max_context: 131072}   # multi-turn: prompts grow with each conversation's history

Requests are simulated, never materialised as tokens: a prompt is described by the owners of its blocks
(the shared prompt, the conversation, or the request itself), which is all the prefix cache needs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from bench.errors import BadInput
from bench.model.catalog import DATA
from bench.model.scheduler import Request

WORKLOADS = DATA / "workloads"


class Lengths(BaseModel):
    fixed: int | None = None
    uniform: tuple[int, int] | None = None
    lognormal: dict[str, float] | None = None
    min: int = 1
    max: int = 1 << 20

    @model_validator(mode="after")
    def _one_kind(self) -> Lengths:
        kinds = [k for k in ("fixed", "uniform", "lognormal") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of fixed, uniform, lognormal")
        if self.lognormal is not None and not {"median", "sigma"} <= set(self.lognormal):
            raise ValueError("lognormal needs median and sigma")
        return self

    def sample(self, rng: random.Random) -> int:
        if self.fixed is not None:
            n = self.fixed
        elif self.uniform is not None:
            n = rng.randint(*self.uniform)
        else:
            n = round(rng.lognormvariate(math.log(self.lognormal["median"]), self.lognormal["sigma"]))
        return max(self.min, min(self.max, n))


class SystemPrompt(BaseModel):
    groups: int
    tokens: int


class Sessions(BaseModel):
    count: int
    max_context: int


class Workload(BaseModel):
    name: str
    description: str = ""
    input_len: Lengths
    output_len: Lengths
    system_prompt: SystemPrompt | None = None
    sessions: Sessions | None = None


def load_workload(name_or_path: str) -> Workload:
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOADS / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in WORKLOADS.glob("*.yaml"))
        raise BadInput(f"unknown workload '{name_or_path}'; valid: {', '.join(known)} or a YAML path")
    try:
        return Workload(**(yaml.safe_load(path.read_text()) or {}))
    except yaml.YAMLError as e:
        raise BadInput(f"workload {path} is not valid YAML") from e
    except (ValidationError, TypeError) as e:
        raise BadInput(f"workload {path}: {str(e).splitlines()[-1 if isinstance(e, TypeError) else 1].strip()}") from e


def fixed_workload(input_len: int, output_len: int) -> Workload:
    return Workload(name=f"fixed-{input_len}-{output_len}", input_len=Lengths(fixed=input_len),
                    output_len=Lengths(fixed=output_len))


def _keys(runs: list[tuple[int, int | None]], block: int) -> Callable[[int], list[int]]:
    """Block keys of a sequence made of runs [(end_token, owner), ...]: block i belongs to the owner of its last
    token, keyed owner * 2**24 + i. Position keys are enough: an owner's content at a position never changes.
    A run owned by None is the request's own content: no one else can share it, so it and all after it get no
    keys (they are simply freed at the end, as an unshared radix node would be evicted first)."""

    def keys(n: int) -> list[int]:
        out, lo, blocks = [], 0, n // block
        for end, owner in runs:
            hi = min(end // block, blocks)
            if owner is None:
                break
            base = owner << 24
            out += range(base + lo, base + hi)
            lo = hi
            if hi >= blocks:
                break
        return out

    return keys


def make_requests(wl: Workload, rate: float, n: int, seed: int, block: int, context: int) -> list[Request]:
    """n requests arriving as a Poisson process of `rate` per second (rate <= 0 or inf: all at time 0)."""
    rng = random.Random(seed)
    history: dict[int, tuple[int, int]] = {}  # session -> (owner id, tokens so far)
    next_owner = 1 + (wl.system_prompt.groups if wl.system_prompt else 0)
    t, out = 0.0, []
    for i in range(n):
        if 0 < rate < math.inf:
            t += rng.expovariate(rate)
        new, answer = wl.input_len.sample(rng), wl.output_len.sample(rng)
        runs: list[tuple[int, int | None]] = []
        start = 0
        s = rng.randrange(wl.sessions.count) if wl.sessions else i
        if wl.system_prompt:  # a conversation keeps its system prompt
            g = s % wl.system_prompt.groups if wl.sessions else rng.randrange(wl.system_prompt.groups)
            start = wl.system_prompt.tokens
            runs.append((start, 1 + g))
        owner = None
        if wl.sessions:
            owner, length = history.get(s, (0, start))
            if not owner or length + new + answer > wl.sessions.max_context:
                owner, length, next_owner = next_owner, start, next_owner + 1
            history[s] = (owner, length + new + answer)
            start = length
        prompt = min(start + new, context - 1)
        answer = max(1, min(answer, context - prompt))
        runs.append((prompt + answer, owner))
        keys = _keys(runs, block)
        out.append(Request(rid=str(i), prompt_len=prompt, max_new=answer, arrival=t,
                           prompt_keys=keys(prompt), seq_keys=keys))
    return out
