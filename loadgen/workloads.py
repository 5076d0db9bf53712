"""Seeded request mixes: what each request asks. Request i is a pure function of (workload, seed, i), so a run
is reproducible and distributed workers build exactly their share of it without talking to each other.

Prompt text is made of common English words, about one token each in the usual BPE vocabularies; lengths are
asked for in tokens and the server's `usage` says what they really were.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from bench import files
from bench.errors import BadInput
from loadgen.workload_schema import LengthSpec, WorkloadSpec

DATA = Path(__file__).resolve().parent.parent / "data" / "workloads"
DEFAULT_TOOL_OUTPUT = {"dist": "lognormal", "median": 1200, "sigma": 0.7, "min": 50, "max": 16000}
SHAREGPT_MAX_BYTES = 1 << 31  # the whole published ShareGPT set is ~650 MB

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no "
    "way could people my than first water been call who oil its now find long down day did get come made may part "
    "over new sound take only little work know place year live me back give most very after thing our just name "
    "good sentence man think say great where help through much before line right too mean old any same tell boy "
    "follow came want show also around form three small set put end does another well large must big even such "
    "because turn here why ask went men read need land different home us move try kind hand picture again change "
    "off play spell air away animal house point page letter mother answer found study still learn should world"
).split()


class WorkloadError(ValueError):
    """A workload file or option that cannot be used."""


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: `api` is 'chat' or 'completions'; `body` is the JSON body less model/stream."""

    api: str
    body: dict
    kind: str
    input_tokens: int  # asked for; the server's usage says what it was


# ---- lengths -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed, uniform, normal, lognormal or histogram, clipped to [min, max]."""

    dist: str = "fixed"
    params: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: int | dict | LengthSpec, where: str = "length") -> Lengths:
        """N tokens or {dist: ..., ...}, checked by the workload schema (loadgen/workload_schema.py)."""
        if isinstance(spec, int | float) and not isinstance(spec, bool):
            spec = {"dist": "fixed", "value": spec}
        if not isinstance(spec, LengthSpec):
            parsed, wrong = files.problems(LengthSpec, spec, where)
            if wrong:
                raise WorkloadError("\n".join(wrong))
            spec = parsed
        return cls(spec.dist, {k: v for k, v in spec.model_dump(exclude_none=True).items() if k != "dist"})

    def sample(self, rng: random.Random) -> int:
        p = self.params
        if self.dist == "fixed":
            v = p["value"]
        elif self.dist == "uniform":
            v = rng.randint(int(p["min"]), int(p["max"]))
        elif self.dist == "normal":
            v = rng.gauss(p["mean"], p["std"])
        elif self.dist == "lognormal":
            v = math.exp(rng.gauss(math.log(p["median"]), p["sigma"]))
        else:
            lo, hi, _ = rng.choices(p["bins"], weights=[b[2] for b in p["bins"]])[0]
            v = rng.uniform(lo, hi)
        v = max(int(p.get("min", 1)), min(int(round(v)), int(p.get("max", 1 << 20))))
        return max(1, v)

    def mean(self) -> float:
        rng = random.Random(0)
        return sum(self.sample(rng) for _ in range(400)) / 400


_CORPUS_WORDS = 1 << 18
_corpus: tuple[str, list[int]] | None = None


def corpus() -> tuple[str, list[int]]:
    """A fixed seeded stream of words and each word's start offset; prompts are slices of it. Built once a process
    (about 0.1 s): Plan builds it before a run starts, not inside the first request."""
    global _corpus
    if _corpus is None:
        words = random.Random(12345).choices(_WORDS, k=_CORPUS_WORDS)
        starts, pos = [], 0
        for w in words:
            starts.append(pos)
            pos += len(w) + 1
        starts.append(pos)
        _corpus = (" ".join(words) + " ", starts)
    return _corpus


def text(rng: random.Random, tokens: int) -> str:
    """`tokens` words from a seeded offset of the corpus (a slice: cheap even for 256k-token prompts)."""
    words, starts = corpus()
    parts, left = [], max(1, tokens)
    while left > 0:
        n = min(left, _CORPUS_WORDS // 2)
        o = rng.randrange(_CORPUS_WORDS - n)
        parts.append(words[starts[o] : starts[o + n] - 1])
        left -= n
    return " ".join(parts)


def seeded(*parts: object) -> random.Random:
    """An independent generator for one (seed, purpose, index) tuple."""
    key = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(key, "little"))


# ---- the workload ----------------------------------------------------------------------------------------------------
@dataclass
class Workload:
    """A named request mix. `request(i)` builds request i; nothing is drawn from a shared generator."""

    name: str
    type: str = "synthetic"
    api: str = "chat"
    description: str = ""
    seed: int = 0
    input: Lengths = field(default_factory=lambda: Lengths("fixed", {"value": 256}))
    output: Lengths = field(default_factory=lambda: Lengths("fixed", {"value": 128}))
    options: dict = field(default_factory=dict)
    ignore_eos: bool = True  # SGLang/vLLM extension: generate exactly max_tokens (off for hosted APIs)
    _sharegpt: list | None = None

    def to_dict(self) -> dict:
        """What from_dict reads back: the form a run's config stores and sends to workers."""
        return {"name": self.name, "type": self.type, "api": self.api, "seed": self.seed,
                **({"description": self.description} if self.description else {}),
                "input": {"dist": self.input.dist, **self.input.params},
                "output": {"dist": self.output.dist, **self.output.params}, "ignore_eos": self.ignore_eos,
                **self.options}

    def request(self, i: int, trace_row: dict | None = None) -> RequestSpec:
        rng = seeded(self.seed, self.name, i)
        if trace_row is not None or self.type == "trace":
            return self._trace(rng, trace_row or {})
        build = {"synthetic": self._synthetic, "long_context": self._synthetic, "shared_prefix": self._shared_prefix,
                 "multi_turn": self._multi_turn, "agentic_coding": self._agentic, "sharegpt": self._sharegpt_req}
        return build[self.type](rng, i)

    def _spec(self, messages: list[dict], max_tokens: int, input_tokens: int, extra: dict | None = None
              ) -> RequestSpec:
        body: dict = {"max_tokens": max_tokens}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = messages
        else:
            body["prompt"] = "\n\n".join(str(m.get("content") or "") for m in messages)
        body.update(extra or {})
        return RequestSpec(self.api, body, self.name, input_tokens)

    def _synthetic(self, rng: random.Random, i: int) -> RequestSpec:
        n = self.input.sample(rng)
        return self._spec([{"role": "user", "content": text(rng, n)}], self.output.sample(rng), n)

    def _shared_prefix(self, rng: random.Random, i: int) -> RequestSpec:
        groups, sys_len = int(self.options.get("groups", 8)), int(self.options.get("system_tokens", 2048))
        g = i % groups
        system = text(seeded(self.seed, self.name, "system", g), sys_len)
        if self.options.get("questions"):  # N system prompts x M questions, then the same N x M again
            rng = seeded(self.seed, self.name, "question", g, (i // groups) % int(self.options["questions"]))
        n = self.input.sample(rng)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text(rng, n)}]
        return self._spec(messages, self.output.sample(rng), sys_len + n)

    def _session(self, i: int) -> tuple[int, int]:
        """Request i -> (session, turn). `concurrent_sessions` sessions are interleaved, each sent turn by turn."""
        c, turns = int(self.options.get("concurrent_sessions", 8)), int(self.options.get("turns", 4))
        block, r = divmod(i, c * turns)
        return block * c + r % c, r // c

    def _multi_turn(self, rng: random.Random, i: int) -> RequestSpec:
        session, turn = self._session(i)
        srng = seeded(self.seed, self.name, "session", session)
        messages, total = [], 0
        if self.options.get("system_tokens"):  # a shared system prompt per group of sessions
            sys_len = int(self.options["system_tokens"])
            g = session % int(self.options.get("groups", 1))
            messages.append({"role": "system", "content": text(seeded(self.seed, self.name, "system", g), sys_len)})
            total += sys_len
        for k in range(turn + 1):
            n = self.input.sample(srng)
            messages.append({"role": "user", "content": text(srng, n)})
            total += n
            answer = self.output.sample(srng)
            if k < turn:  # earlier answers are seeded text of the drawn length, not what the server said
                messages.append({"role": "assistant", "content": text(srng, answer)})
                total += answer
        return self._spec(messages, answer, total)

    def _agentic(self, rng: random.Random, i: int) -> RequestSpec:
        """A coding agent: a long shared system prompt with tool definitions, then per turn an assistant tool call
        and a tool result (file contents, command output); each turn resends everything so far."""
        session, turn = self._session(i)
        srng = seeded(self.seed, self.name, "session", session)
        sys_len = int(self.options.get("system_tokens", 4096))
        tool_out = Lengths.parse(self.options.get("tool_output", DEFAULT_TOOL_OUTPUT))
        system = text(seeded(self.seed, self.name, "system"), sys_len)
        task = self.input.sample(srng)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text(srng, task)}]
        total = sys_len + task
        for k in range(turn):
            call_id = f"call_{session}_{k}"
            tool = srng.choice(_TOOLS)["function"]["name"]
            args = json.dumps({"path": f"src/{srng.choice(_WORDS)}_{k}.py"} if tool != "run" else
                              {"command": f"pytest -q tests/test_{srng.choice(_WORDS)}.py"})
            messages.append({"role": "assistant", "content": text(srng, self.output.sample(srng) // 4),
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": tool, "arguments": args}}]})
            out = tool_out.sample(srng)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text(srng, out)})
            total += out + 40
        return self._spec(messages, self.output.sample(srng), total, {"tools": _TOOLS})

    def _sharegpt_req(self, rng: random.Random, i: int) -> RequestSpec:
        convs = self.sharegpt_pairs()
        epoch, k = divmod(i, len(convs))
        if self.options.get("shuffle", True):  # every conversation once per epoch, in a seeded order
            order = list(range(len(convs)))
            seeded(self.seed, self.name, "order", epoch).shuffle(order)
            k = order[k]
        prompt, answer = convs[k]
        max_out = int(self.options.get("max_output_tokens", 2048))
        return self._spec([{"role": "user", "content": prompt}], max(1, min(max_out, len(answer) // 4)),
                          max(1, len(prompt) // 4))

    def check(self) -> Workload:
        """Reads now the file a workload takes its prompts from (a ShareGPT JSON): a file that cannot be read or is
        of the wrong format is a WorkloadError before anything is sent, not an error in every request."""
        if self.type == "sharegpt":
            self.sharegpt_pairs()
        return self

    def sharegpt_pairs(self) -> list[tuple[str, str]]:
        """(prompt, reply) of the file's first human/gpt turns, read once."""
        if self._sharegpt is None:
            path = Path(self.options.get("path", ""))
            if not path.is_file() and not path.is_absolute():
                path = DATA.parent.parent / path  # built-in workloads name repo files
            if not path.is_file():
                raise WorkloadError(f"sharegpt workload: no file at {path!s}")
            try:
                raw = files.read(path, "ShareGPT", "json", SHAREGPT_MAX_BYTES)
            except BadInput as e:
                raise WorkloadError(f"sharegpt workload: {e}") from None
            pairs = []
            for item in raw if isinstance(raw, list) else []:
                turns = item.get("conversations") or [] if isinstance(item, dict) else []
                if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
                    pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
            if not pairs:
                raise WorkloadError(f"sharegpt workload: {path} has no human/gpt conversation pairs")
            self._sharegpt = pairs
        return self._sharegpt

    def _trace(self, rng: random.Random, row: dict) -> RequestSpec:
        """Mooncake-style: hash_ids name blocks of `block_tokens` tokens; equal ids give equal text, so requests
        that share leading ids share a prefix the server can cache."""
        block = int(self.options.get("block_tokens", 512))
        n_in = int(row.get("input_length") or self.input.sample(rng))
        parts, have = [], 0
        for h in row.get("hash_ids") or []:
            if have >= n_in:
                break
            take = min(block, n_in - have)
            parts.append(text(seeded(self.seed, "block", h), take))
            have += take
        if have < n_in:
            parts.append(text(rng, n_in - have))
        n_out = int(row.get("output_length") or self.output.sample(rng))
        return self._spec([{"role": "user", "content": " ".join(parts)}], max(1, n_out), n_in)


_TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, desc, arg in (("read_file", "Read a file of the repository.", "path"),
                            ("edit_file", "Replace a file's contents.", "path"),
                            ("run", "Run a shell command in the repository.", "command"))
]


# ---- loading -------------------------------------------------------------------------------------------------------
def names() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.yaml"))


def _read(path: Path) -> dict:
    try:
        spec = files.read(path, "workload", "yaml")
    except BadInput as e:
        raise WorkloadError(str(e)) from None
    if not isinstance(spec, dict):
        raise WorkloadError(f"{path}: a workload is a mapping (type, input, output, ...), not a {type(spec).__name__}")
    return spec


def load(name_or_path: str, seed: int | None = None, api: str | None = None) -> Workload:
    """A built-in name (data/workloads/NAME.yaml), a workload YAML path, or a ShareGPT JSON path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return from_dict({"name": path.stem, "type": "sharegpt", "path": str(path.resolve())}, seed, api)
    if not path.exists():
        path = DATA / f"{name_or_path}.yaml"
        if not path.is_file():
            raise WorkloadError(f"unknown workload {name_or_path!r}: not a file, and not one of {', '.join(names())}")
    spec = _read(path)  # a FIFO or a device is refused here, with its path
    spec.setdefault("name", path.stem)
    if isinstance(spec.get("path"), str) and Path(spec["path"]).is_file():  # the same file in every worker process
        spec["path"] = str(Path(spec["path"]).resolve())
    return from_dict(spec, seed, api, source=str(path))


def synthetic(input_len: str, output_len: str, seed: int | None = None, api: str | None = None) -> Workload:
    """Random prompts and answers of N tokens, or uniform:A-B (bench_serving's random dataset), e.g. for
    `capbench run --input-len 1024 --output-len uniform:128-512`."""
    def lengths(text: str, what: str) -> dict:
        kind, _, value = text.strip().lower().rpartition(":")
        try:
            if kind == "uniform":
                lo, _, hi = value.partition("-")
                out = {"dist": "uniform", "min": int(lo), "max": int(hi)}
                ok = 1 <= out["min"] <= out["max"]
            elif not kind:
                out = {"dist": "fixed", "value": int(value)}
                ok = out["value"] >= 1
            else:
                ok = False
        except ValueError:
            ok = False
        if not ok:
            raise WorkloadError(f"{what} takes N or uniform:A-B (tokens, 1 <= A <= B), not {text!r}")
        return out

    i, o = lengths(input_len, "--input-len"), lengths(output_len, "--output-len")
    name = f"synthetic-{input_len}-{output_len}".replace(":", "")
    return from_dict({"name": name, "type": "synthetic", "input": i, "output": o}, seed, api)


OLD_KEYS = ("input_len", "output_len", "system_prompt", "sessions")


def from_dict(spec: dict, seed: int | None = None, api: str | None = None, source: str = "workload") -> Workload:
    """The schema (data/workloads/README.md, loadgen/workload_schema.py): {name, type, api, description, input,
    output, ...type options}; every problem a line naming `source`, the key and the value."""
    old = [k for k in OLD_KEYS if k in spec]
    if old:
        raise WorkloadError(f"{source}: {', '.join(old)} belong to an older schema; write "
                            "input:/output: {dist: ...}, groups:/system_tokens:, concurrent_sessions:/turns: "
                            "(data/workloads/README.md)")
    try:
        wl = files.check(WorkloadSpec, {**spec, **({"api": api} if api else {})}, source)
    except BadInput as e:
        raise WorkloadError(str(e)) from None
    if wl.type == "agentic_coding" and wl.api != "chat":
        raise WorkloadError(f"{source}: api: agentic_coding needs the chat API (tool calls), got {wl.api!r}")
    known = {"name", "type", "api", "input", "output", "seed", "ignore_eos", "description"}
    options = {k: v for k, v in wl.model_dump(exclude_none=True).items() if k not in known and k in spec}
    return Workload(name=wl.name or wl.type, type=wl.type, api=wl.api, seed=wl.seed if seed is None else seed,
                    description=wl.description, input=Lengths.parse(wl.input), output=Lengths.parse(wl.output),
                    options=options, ignore_eos=wl.ignore_eos)
