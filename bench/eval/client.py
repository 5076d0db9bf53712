"""Asking an OpenAI-compatible endpoint: one chat completion, greedy and seeded, with tools or top logprobs when a
suite needs them. An endpoint that hangs, refuses or answers something that is not a chat completion gives a Reply
with `error` set: the suites count it as the endpoint's error, never as a wrong answer of the model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

TOP_LOGPROBS = 5


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # as sent: {"function": {"name", "arguments" (a string)}}
    tokens: list[str] = field(default_factory=list)  # with logprobs: the answer's tokens
    top: list[dict[str, float]] = field(default_factory=list)  # per position: token -> logprob
    finish: str | None = None
    completion_tokens: int | None = None
    error: str | None = None  # timeout | http_NNN | malformed_response | connection error's name


@dataclass
class Endpoint:
    url: str
    model: str
    timeout_s: float = 600.0
    api_key_env: str | None = None

    def headers(self) -> dict:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}


async def chat(client: httpx.AsyncClient, ep: Endpoint, messages: list[dict], max_tokens: int, seed: int,
               tools: list[dict] | None = None, logprobs: bool = False, extra: dict | None = None) -> Reply:
    body = {"model": ep.model, "messages": messages, "temperature": 0, "seed": seed, "max_tokens": max_tokens,
            "stream": False, **(extra or {})}
    if tools:
        body["tools"] = tools
    if logprobs:
        body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    try:
        r = await client.post(f"{ep.url}/v1/chat/completions", json=body, headers=ep.headers(),
                              timeout=httpx.Timeout(ep.timeout_s, connect=10))
    except httpx.TimeoutException:
        return Reply(error="timeout")
    except httpx.HTTPError as e:
        return Reply(error=type(e).__name__)
    if r.status_code != 200:
        return Reply(error=f"http_{r.status_code}")
    try:
        return _reply(r.json())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Reply(error="malformed_response")


def _reply(body: dict) -> Reply:
    choice = body["choices"][0]
    message = choice["message"]
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if not isinstance(content, str) or not isinstance(calls, list):
        raise TypeError
    for c in calls:
        if not isinstance(c["function"]["name"], str):
            raise TypeError
    lp = (choice.get("logprobs") or {}).get("content") or []
    return Reply(content=content, tool_calls=calls, tokens=[c["token"] for c in lp],
                 top=[{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} or {c["token"]: c["logprob"]}
                      for c in lp],
                 finish=choice.get("finish_reason"), completion_tokens=(body.get("usage") or {}).get(
                     "completion_tokens"))
