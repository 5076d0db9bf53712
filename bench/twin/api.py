"""The OpenAI-compatible request and response bodies of the twin: validation and the JSON it sends back.

Shapes follow SGLang 0.5.23's serving_completions.py / serving_chat.py: one token per SSE chunk, the finish
reason on the last token's chunk, then (with stream_options.include_usage) a usage chunk with `choices: []`,
then `data: [DONE]`. Usage carries prompt_tokens_details.cached_tokens (SGLang's --enable-cache-report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from bench.twin.text import EOS, WORDS, Synth, Tokenizer


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> bytes:
        kind = "invalid_request_error" if self.status == 400 else "server_error"
        return json.dumps({"object": "error", "error": {"message": self.message, "type": kind,
                                                        "param": self.param, "code": self.status}}).encode()


@dataclass
class GenParams:
    chat: bool
    prompt_ids: list[int]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    logprobs: int | None = None  # number of top logprobs per token (0: only the chosen token's), None: off
    model: str | None = None
    extra: dict = field(default_factory=dict)


def _get(body: dict, key: str, kinds: tuple, default=None, lo: float | None = None, hi: float | None = None):
    val = body.get(key, default)
    if val is None:
        return default
    if isinstance(val, bool) and bool not in kinds or not isinstance(val, kinds):
        names = " or ".join(k.__name__ for k in kinds).replace("int or float", "number")
        raise ApiError(f"'{key}' must be {names}, got {json.dumps(val)[:40]}", key)
    if lo is not None and val < lo or hi is not None and val > hi:
        raise ApiError(f"'{key}' must be between {lo} and {hi}, got {val}", key)
    return val


def parse(raw: bytes, chat: bool, tok: Tokenizer) -> GenParams:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    if _get(body, "n", (int,), 1) != 1:
        raise ApiError("the twin supports n = 1 only", "n")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError("'messages' must be a non-empty list of messages", "messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(f"messages[{i}] must be an object with a string 'role'", "messages")
            if not isinstance(m.get("content"), str | list | type(None)):
                raise ApiError(f"messages[{i}].content must be a string or a list of parts", "messages")
        ids = tok.encode_chat(msgs)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
        elif isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
            ids = prompt
        else:
            raise ApiError("'prompt' must be a string or a non-empty list of token ids (one prompt)", "prompt")
    opts = _get(body, "stream_options", (dict,), {})
    max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    p = GenParams(
        chat=chat, prompt_ids=ids, stream=_get(body, "stream", (bool,), False),
        include_usage=_get(opts, "include_usage", (bool,), False),
        max_tokens=_get(body, max_key, (int,), None, lo=1),
        min_tokens=_get(body, "min_tokens", (int,), 0, lo=0),
        ignore_eos=_get(body, "ignore_eos", (bool,), False),
        temperature=float(_get(body, "temperature", (int, float), 1.0, lo=0, hi=2)),
        model=_get(body, "model", (str,), None),
    )
    _get(body, "top_p", (int, float), 1.0, lo=0, hi=1)
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise ApiError(f"'min_tokens' ({p.min_tokens}) must not exceed max_tokens ({p.max_tokens})", "min_tokens")
    if chat:
        if _get(body, "logprobs", (bool,), False):
            p.logprobs = _get(body, "top_logprobs", (int,), 0, lo=0, hi=20)
    else:
        p.logprobs = _get(body, "logprobs", (int,), None, lo=0, hi=20)
    return p


def output_length(p: GenParams, synth: Synth, room: int) -> tuple[int, str]:
    """Tokens the request will produce and its finish reason, given `room` tokens left in the context."""
    limit = min(p.max_tokens or room, room)
    if p.ignore_eos:
        return limit, "length"
    natural = max(synth.natural_length(), p.min_tokens)
    return (natural, "stop") if natural < limit else (limit, "length")


def token_logprobs(p: GenParams, synth: Synth, i: int, offset: int) -> dict:
    """The logprobs object of token i, in the completions (legacy) or chat shape."""
    top = synth.top(i, max(1, p.logprobs or 0))
    text = " " + WORDS[top[0][0]]
    if p.chat:
        entry = {"token": text, "logprob": top[0][1], "bytes": list(text.encode()),
                 "top_logprobs": [{"token": " " + WORDS[w], "logprob": lp, "bytes": list((" " + WORDS[w]).encode())}
                                  for w, lp in top[: p.logprobs]]}
        return {"content": [entry]}
    return {"tokens": [text], "token_logprobs": [top[0][1]],
            "top_logprobs": [{" " + WORDS[w]: lp for w, lp in top[: p.logprobs]}] if p.logprobs else None,
            "text_offset": [offset]}


def merge_logprobs(p: GenParams, parts: list[dict]) -> dict | None:
    if not parts:
        return None
    if p.chat:
        return {"content": [e for part in parts for e in part["content"]]}
    return {"tokens": [t for part in parts for t in part["tokens"]],
            "token_logprobs": [t for part in parts for t in part["token_logprobs"]],
            "top_logprobs": [t for part in parts for t in part["top_logprobs"]] if p.logprobs else None,
            "text_offset": [t for part in parts for t in part["text_offset"]]}


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@lru_cache(maxsize=64)
def _quoted(text: str) -> str:
    return json.dumps(text)


def chunk(p: GenParams, rid: str, created: int, model: str, text: str | None, finish: str | None,
          logprobs: dict | None = None, first: bool = False) -> bytes:
    """One SSE event."""
    matched = EOS if finish == "stop" else None
    if logprobs is None and not first:  # the common case, formatted without json.dumps (a twin's hot path)
        end = ("null" if finish is None else f'"{finish}"', "null" if matched is None else str(matched))
        if p.chat:
            return (f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},"model":'
                    f'{_quoted(model)},"choices":[{{"index":0,"delta":{{"content":{json.dumps(text)}}},'
                    f'"logprobs":null,"finish_reason":{end[0]},"matched_stop":{end[1]}}}],"usage":null}}\n\n'
                    ).encode()
        return (f'data: {{"id":"{rid}","object":"text_completion","created":{created},"model":{_quoted(model)},'
                f'"choices":[{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{end[0]},'
                f'"matched_stop":{end[1]}}}],"usage":null}}\n\n').encode()
    if p.chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": None}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def usage_chunk(p: GenParams, rid: str, created: int, model: str, u: dict) -> bytes:
    obj = "chat.completion.chunk" if p.chat else "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": u}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def response(p: GenParams, rid: str, created: int, model: str, text: str, finish: str, logprobs: dict | None,
             u: dict) -> dict:
    matched = EOS if finish == "stop" else None
    if p.chat:
        msg = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        choice = {"index": 0, "message": msg, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
                "usage": u}
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "usage": u}
