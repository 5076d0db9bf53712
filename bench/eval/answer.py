"""One problem's answer from one endpoint, as every suite gives it and the DB stores it."""

from __future__ import annotations

from dataclasses import dataclass

OUTCOMES = ("passed", "failed", "error", "not_run")  # error: the endpoint's; not_run: not contained, not scored


@dataclass
class Answer:
    suite: str
    problem_id: str
    outcome: str  # one of OUTCOMES
    unparsed: bool = False  # a tool call whose arguments are not JSON (a failure, and counted apart)
    text: str = ""  # what the model answered (code, tool calls), cut to TEXT_CHARS
    detail: str = ""  # why it failed, the endpoint's error, or what the checker said
    latency_s: float | None = None
    completion_tokens: int | None = None

    @property
    def scored(self) -> bool:
        return self.outcome in ("passed", "failed")


TEXT_CHARS = 20_000


def cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + f"... [{len(text) - TEXT_CHARS} more chars]"
