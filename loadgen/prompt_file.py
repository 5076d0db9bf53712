"""A prompt JSONL (`capbench run --workload prompts.jsonl`, or a workload YAML `type: prompts, path: ...`): one
request a line, checked by bench/files.py (a bad line is one line naming it, `prompts.jsonl:17: ...`).

Each line: {"messages": [...]} or {"text": "..."}; optional "output_len" (or "max_tokens"), "session_id",
"timestamp". Rows of one session id are its turns, in file order: turn N+1 is sent after turn N's answer and carries
it (loadgen/sessions.py's closed loop), then the row's own messages. "timestamp" is milliseconds (AIPerf's and
Mooncake's unit) unless the workload says `timestamp_unit: s`; with `--profile trace` each request (each session's
first turn) is sent at its timestamp, counted from the first; with any other profile the profile's arrivals decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from bench import files
from bench.errors import BadInput
from bench.files import NonNegative, Schema, Tokens
from loadgen import sessions
from loadgen.prompts import RequestSpec, WorkloadError, seeded

MAX_BYTES = 1 << 31  # a production trace of a day is hundreds of MB
UNITS = {"ms": 1e-3, "s": 1.0}


class Message(Schema):
    """A chat message as the OpenAI API takes it; keys past role and content (name, tool_calls, ...) go as given."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None


class PromptRow(Schema):
    messages: Annotated[list[Message], Field(min_length=1, max_length=100_000)] | None = None
    text: str | None = None
    output_len: Tokens | None = None
    max_tokens: Tokens | None = None
    session_id: Annotated[str, Field(min_length=1, max_length=200)] | int | None = None
    timestamp: NonNegative | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> PromptRow:
        if (self.messages is None) == (self.text is None):
            raise ValueError("a row has either messages or text (one of them)")
        if self.output_len is not None and self.max_tokens is not None and self.output_len != self.max_tokens:
            raise ValueError("output_len and max_tokens differ: give one")
        return self

    def turn_messages(self) -> list[dict]:
        if self.text is not None:
            return [{"role": "user", "content": self.text}]
        return [m.model_dump(exclude_none=True) for m in self.messages or []]

    @property
    def out_tokens(self) -> int | None:
        return self.output_len or self.max_tokens


@dataclass
class PromptFile:
    """The file's requests as units: a session's rows (its turns), or one row without a session id (a request)."""

    path: str
    units: list[list[PromptRow]]
    timed: bool  # every row has a timestamp
    sessions: bool  # some row has a session id: the units are sent as closed-loop sessions

    def offsets(self, unit: str = "ms") -> list[float]:
        """Seconds from the first unit's timestamp to each unit's (its first turn's)."""
        ts = [u[0].timestamp * UNITS[unit] for u in self.units]
        return [t - ts[0] for t in ts] if ts else []

    @property
    def mean_turns(self) -> int:
        return max(1, round(sum(map(len, self.units)) / max(1, len(self.units))))


def read(path: str) -> PromptFile:
    """The prompt file, every line checked; BadInput (one line, naming the file and line) for the first bad one."""
    data = files.regular_file(path, "prompt", MAX_BYTES)
    name = str(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{name}: not UTF-8 text (byte {e.start}); a prompt file is JSON lines") from None
    units: dict[object, list[PromptRow]] = {}
    timed = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        row, wrong = files.problems(PromptRow, files.parse(line, where, "prompt", "json"))
        if wrong:
            raise BadInput(f"{where}: {'; '.join(wrong)}")
        timed.add(row.timestamp is not None)
        if len(timed) > 1:
            raise BadInput(f"{where}: {'no timestamp' if row.timestamp is None else 'a timestamp'}, where earlier "
                           "rows have the other: give every row a timestamp, or none")
        key = ("s", row.session_id) if row.session_id is not None else ("r", n)
        units.setdefault(key, []).append(row)
    if not units:
        raise BadInput(f"{name}: no prompt rows ({{\"messages\": [...]}} or {{\"text\": ...}}, one a line)")
    ordered = list(units.values())
    if timed == {True}:  # a session starts at its first turn's time (a stable sort keeps the file's order on ties)
        ordered.sort(key=lambda u: u[0].timestamp)
    return PromptFile(str(path), ordered, timed == {True}, any(k[0] == "s" for k in units))


_CACHE: dict[str, PromptFile] = {}


def load(path: str) -> PromptFile:
    """read(), once per process and path; a WorkloadError where the file cannot be used."""
    if path not in _CACHE:
        try:
            _CACHE[path] = read(path)
        except BadInput as e:
            raise WorkloadError(str(e)) from None
    return _CACHE[path]


def _tokens(messages: list[dict]) -> int:
    """About a token per 4 characters (the server's usage says what it really was)."""
    return max(1, sum(len(str(m.get("content") or "")) for m in messages) // 4)


def request(wl, i: int) -> RequestSpec:  # noqa: ANN001 (loadgen.workloads.Workload: it imports this module)
    """Request i of a prompt file without sessions: its units in order, again from the start when they run out."""
    pf = load(wl.options["path"])
    row = pf.units[i % len(pf.units)][0]
    messages = row.turn_messages()
    return wl._spec(messages, row.out_tokens or wl.output.sample(seeded(wl.seed, wl.name, i)), _tokens(messages))


class FileSession:
    """A session of the file, turn by turn (loadgen/sessions.Session's interface): each turn is the history so far,
    the previous turns' real answers included, then this row's messages."""

    def __init__(self, wl, index: int):  # noqa: ANN001
        pf = load(wl.options["path"])
        self.wl, self.index = wl, index
        self.rows = pf.units[index % len(pf.units)]
        self.rng = seeded(wl.seed, wl.name, "session", index)
        self.turns, self.turn = len(self.rows), 0
        self.messages = self.rows[0].turn_messages()
        self.think = sessions.think_time(wl.options.get("think_s", 0.0))

    def request(self) -> RequestSpec:
        row = self.rows[self.turn]
        return self.wl._spec([dict(m) for m in self.messages], row.out_tokens or self.wl.output.sample(self.rng),
                             _tokens(self.messages))

    def answered(self, answer: str, tokens: int | None) -> bool:
        self.turn += 1
        if self.turn >= self.turns:
            return False
        self.messages += [{"role": "assistant", "content": answer}, *self.rows[self.turn].turn_messages()]
        return True

    def think_s(self) -> float:
        return sessions._think(self.think, self.rng)


def replay(prof, wl) -> None:  # noqa: ANN001 (loadgen.profiles.Profile, loadgen.workloads.Workload)
    """`--profile trace` with a prompt file: its timestamps are the schedule (each request, or each session's first
    turn, at its time), in place of the profile's trace file; WorkloadError where its rows have none. (Not
    loadgen.profiles' ProfileError: that module imports Locust, which patches any process that imports this one.)"""
    if prof.type != "trace" or (wl.type != "prompts" and prof.params.get("path")):
        return
    pf = load(wl.options["path"]) if wl.type == "prompts" and wl.options.get("path") else None
    if pf is None or not pf.timed:
        raise WorkloadError("profile trace replays a Mooncake JSONL (path=...) or a prompt file whose rows have "
                            "timestamps; this workload's have none")
    prof.params["_offsets"] = pf.offsets(wl.options.get("timestamp_unit", "ms"))
