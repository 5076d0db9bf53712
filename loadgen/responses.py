"""What a server's answer said: an SSE stream or one JSON body read into first/last token times, gaps, chunk count
and usage; anything of the wrong shape, too large or cut short is a RequestFailed with its error kind."""

from __future__ import annotations

import json
import time
from copy import copy

from geventhttpclient.response import HTTPConnectionClosed

try:  # optional: 3-5x faster than json on the per-chunk path; same results
    from orjson import loads as _loads
except ImportError:
    _loads = json.loads

EVENT_MAX_BYTES = 1 << 20  # one SSE event larger than this is an error for its request, not a stalled timing loop
COUNT_MAX = 2**63 - 1  # what msgpack carries; the store's narrower columns say what else does not fit


class RequestFailed(Exception):
    """What Locust's statistics see for a failed request; `kind` is the record's error_kind."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def token_count(value: object, name: str, notes: list[str]) -> int | None:
    """A token count as the server gave it, or None (with a note) when it is not a count."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= COUNT_MAX:
        return value
    notes.append(f"usage.{name} {str(value)[:40]!r} is not a token count: stored as NULL")
    return None


class Stream:
    """What the response said: first/last token times (perf_counter), gaps, chunk count, usage, stream errors; the
    first content token's time (not reasoning, not a tool call); the answer's text when asked (keep_text: a
    session's next turn carries it)."""

    __slots__ = ("start", "first", "last", "gaps", "chunks", "usage", "nbytes", "error", "server_id", "event_max",
                 "on_first", "first_content", "keep_text", "text")

    def __init__(self, start: float, event_max: int = EVENT_MAX_BYTES, keep_text: bool = False):
        self.start = start
        self.event_max = event_max
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        self.usage: dict | None = None
        self.nbytes = 0
        self.error: RequestFailed | None = None
        self.server_id: str | None = None
        self.on_first = None  # called with the first token's time, while the answer is still streaming
        self.first_content: float | None = None
        self.keep_text = keep_text
        self.text: list[str] = []

    def _content(self, piece: object) -> None:
        if self.first_content is None:
            self.first_content = self.last
        if self.keep_text and isinstance(piece, str):
            self.text.append(piece)

    def _token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            if self.on_first is not None:
                self.on_first(now)
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.chunks += 1

    def token_counts(self, rec: dict) -> list[str]:
        """The answer's token counts into the record (from usage, else the chunks counted); notes on what was
        not a count."""
        notes: list[str] = []
        if self.usage:
            u = self.usage
            rec["tokens_from"] = "usage"
            prompt_details, completion_details = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
            prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
            completion_details = completion_details if isinstance(completion_details, dict) else {}
            for name, value in (("prompt_tokens", u.get("prompt_tokens")),
                                ("completion_tokens", u.get("completion_tokens")),
                                ("cached_tokens", prompt_details.get("cached_tokens")),
                                ("reasoning_tokens", u.get("reasoning_tokens",
                                                           completion_details.get("reasoning_tokens")))):
                rec[name] = token_count(value, name, notes)
        elif self.chunks:
            rec["tokens_from"] = "chunks"
            rec["completion_tokens"] = self.chunks
        return notes

    def read_sse(self, resp) -> None:
        """Events are read whole (one readline per event, up to the blank line that ends it): the separator is
        \n\n, or \r\n\r\n when the first line ends in \r\n. (readline() without a separator waits for \r\n.)"""
        chunk = _readline(resp, b"\n", self.event_max)
        sep = b"\r\n\r\n" if chunk.endswith(b"\r\n") else b"\n\n"
        while chunk:
            self.nbytes += len(chunk)
            for line in chunk.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event: lines
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                self._data(data)
            chunk = _readline(resp, sep, self.event_max)
        raise RequestFailed("early_close", "stream ended before [DONE]")

    def _data(self, data: bytes) -> None:
        try:
            obj = _loads(data)
        except ValueError:
            raise RequestFailed("malformed_stream", f"not JSON: {data[:80]!r}") from None
        if not isinstance(obj, dict):
            raise RequestFailed("malformed_response", f"not a JSON object: {data[:80]!r}")
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed("stream_error", str(msg))
        try:
            self._chunk(obj)
        except (AttributeError, TypeError, KeyError, IndexError) as e:
            raise RequestFailed("malformed_response", f"a chunk of an unexpected shape ({type(e).__name__}: {e}): "
                                f"{data[:80]!r}") from None

    def _chunk(self, obj: dict) -> None:
        choices = obj.get("choices")
        usage = obj.get("usage")
        if usage and not isinstance(usage, dict):
            raise TypeError(f"usage is a {type(usage).__name__}")
        if choices:
            c = choices[0]
            delta = c.get("delta")
            if delta is not None:
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or \
                        delta.get("tool_calls"):
                    self._token()
                    if delta.get("content"):
                        self._content(delta["content"])
            elif c.get("text"):
                self._token()
                self._content(c["text"])
        if obj.get("usage"):
            self.usage = obj["usage"]

    def read_json(self, raw: bytes) -> None:
        self.nbytes = len(raw)
        try:
            obj = _loads(raw)
        except ValueError:
            raise RequestFailed("malformed_stream", f"not JSON: {raw[:80]!r}") from None
        try:
            choice = obj["choices"][0]
            msg = choice.get("message") or {}
            if not isinstance(msg, dict) or ("message" not in choice and not isinstance(choice.get("text"), str)):
                raise TypeError("a choice without a message or a text")
            if msg.get("content") or msg.get("reasoning_content") or choice.get("text") or msg.get("tool_calls"):
                self.chunks = 1
            answer = msg.get("content") or choice.get("text")
            if answer and self.keep_text and isinstance(answer, str):
                self.text.append(answer)
            usage = obj.get("usage")
            if usage and not isinstance(usage, dict):
                raise TypeError(f"usage is a {type(usage).__name__}")
        except (AttributeError, TypeError, KeyError, IndexError) as e:
            raise RequestFailed("malformed_response", f"an answer of an unexpected shape ({type(e).__name__}: {e}): "
                                f"{raw[:80]!r}") from None
        self.usage = usage or None


    def read_embeddings(self, raw: bytes) -> None:
        """An embeddings answer: {data: [{embedding: [...]}, ...], usage: {prompt_tokens}}; its one "token" is the
        whole answer (TTFT = E2E)."""
        self.nbytes = len(raw)
        try:
            obj = _loads(raw)
            data = obj["data"]
            if not isinstance(data, list) or not data or not isinstance(data[0].get("embedding"), list | str):
                raise TypeError("no embedding in data[0]")
            usage = obj.get("usage")
            if usage and not isinstance(usage, dict):
                raise TypeError(f"usage is a {type(usage).__name__}")
        except ValueError:
            raise RequestFailed("malformed_stream", f"not JSON: {raw[:80]!r}") from None
        except (AttributeError, TypeError, KeyError, IndexError) as e:
            raise RequestFailed("malformed_response", f"an answer of an unexpected shape ({type(e).__name__}: {e}): "
                                f"{raw[:80]!r}") from None
        self._token()
        self.usage = usage or None


def _readline(resp, sep: bytes, limit: int) -> bytes:
    """geventhttpclient's HTTPSocketResponse.readline, with a size limit and a scan that resumes where it stopped
    (the library's rescans the whole buffer after every recv: a 50 MB event cost the timing loop seconds)."""
    buf = resp._body_buffer
    scanned = 0
    while True:
        pos = buf.find(sep, max(0, scanned - len(sep) + 1))
        if pos >= 0:
            line = copy(buf[: pos + len(sep)])
            del buf[: pos + len(sep)]
            return line
        scanned = len(buf)
        if scanned > limit:
            raise RequestFailed("event_too_large", f"one SSE event is over {limit} bytes")
        if resp.message_complete:
            return b""
        sock = resp._sock
        if sock is None:
            raise HTTPConnectionClosed("connection closed.")
        try:
            resp.feed(sock.recv(resp.block_size))
        except BaseException:
            resp.release()
            raise
