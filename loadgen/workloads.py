"""Seeded request mixes: what each request asks. Request i is a pure function of (workload, seed, i), so a run
is reproducible and distributed workers build exactly their share of it without talking to each other.

Prompt text is made of common English words, about one token each in the usual BPE vocabularies; lengths are
asked for in tokens and the server's `usage` says what they really were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from bench import files
from bench.errors import BadInput
from loadgen import prompt_file, sessions
from loadgen.prompts import (  # noqa: F401  (their home was here: workloads.text, workloads.Lengths, ...)
    _WORDS,
    DEFAULT_TOOL_OUTPUT,
    Lengths,
    RequestSpec,
    WorkloadError,
    corpus,
    seeded,
    text,
)
from loadgen.workload_schema import WorkloadSpec

DATA = Path(__file__).resolve().parent.parent / "data" / "workloads"
SHAREGPT_MAX_BYTES = 1 << 31  # the whole published ShareGPT set is ~650 MB
KINDS = ("synthetic", "shared_prefix", "long_context", "multi_turn", "agentic_coding", "sharegpt", "trace", "prompts")
SESSION_KINDS = ("multi_turn", "agentic_coding")

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
        if self.type in SESSION_KINDS:
            return sessions.open_loop_request(self, i)
        if self.type == "prompts":
            return prompt_file.request(self, i)
        build = {"synthetic": self._synthetic, "long_context": self._synthetic, "shared_prefix": self._shared_prefix,
                 "sharegpt": self._sharegpt_req}
        return build[self.type](rng, i)

    @property
    def closed_loop(self) -> bool:
        """Sessions whose next turn waits for the previous answer (loadgen/sessions.py), or, `loop: open`, turns
        sent on the profile's schedule with made-up earlier answers."""
        if self.type == "prompts":  # a prompt file's sessions always wait for their answers
            return prompt_file.load(self.options["path"]).sessions
        return self.type in SESSION_KINDS and self.options.get("loop", "closed") == "closed"

    @property
    def session_turns(self) -> int:
        """Turns of a session (a prompt file's: their mean): a closed loop starts a session every so many
        arrivals."""
        if self.type == "prompts":
            return prompt_file.load(self.options["path"]).mean_turns
        return int(self.options.get("turns", 4))

    def session(self, index: int) -> sessions.Session | prompt_file.FileSession:
        """Closed-loop session `index`: made up turn by turn, or a prompt file's session (its rows)."""
        return prompt_file.FileSession(self, index) if self.type == "prompts" else sessions.Session(self, index)

    def _spec(self, messages: list[dict], max_tokens: int, input_tokens: int, extra: dict | None = None
              ) -> RequestSpec:
        body: dict = {"max_tokens": max_tokens}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = messages
        elif self.api == "embeddings":  # the prompt is what is embedded; nothing is generated
            return RequestSpec(self.api, {"input": "\n\n".join(str(m.get("content") or "") for m in messages)},
                               self.name, input_tokens)
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
        if self.type == "prompts":
            if not self.options.get("path"):
                raise WorkloadError(f"workload {self.name}: type prompts needs path: (a prompt JSONL)")
            prompt_file.load(self.options["path"])
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
    """A built-in name (data/workloads/NAME.yaml), a workload YAML path, a ShareGPT JSON path, or a prompt JSONL
    path (loadgen/prompt_file.py)."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return from_dict({"name": path.stem, "type": "sharegpt", "path": str(path.resolve())}, seed, api)
    if path.suffix == ".jsonl":
        prompt_file.load(name_or_path)  # checked as the user named it: its errors name that path
        return from_dict({"name": path.stem, "type": "prompts", "path": str(path.resolve())}, seed, api)
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
    if wl.api == "embeddings" and wl.type in SESSION_KINDS and (wl.loop or "closed") == "closed":
        raise WorkloadError(f"{source}: api: {wl.type} sessions wait for answers, embeddings give none (loop: open, "
                            "or another api)")
    if wl.loop is not None and wl.type not in SESSION_KINDS:
        raise WorkloadError(f"{source}: loop: for {' and '.join(SESSION_KINDS)} workloads only, not {wl.type}")
    if wl.type in (*SESSION_KINDS, "prompts"):
        sessions.think_time(spec.get("think_s", 0.0))  # checked now: a bad one is a WorkloadError
    known = {"name", "type", "api", "input", "output", "seed", "ignore_eos", "description"}
    options = {k: v for k, v in wl.model_dump(exclude_none=True).items() if k not in known and k in spec}
    return Workload(name=wl.name or wl.type, type=wl.type, api=wl.api, seed=wl.seed if seed is None else seed,
                    description=wl.description, input=Lengths.parse(wl.input), output=Lengths.parse(wl.output),
                    options=options, ignore_eos=wl.ignore_eos)
