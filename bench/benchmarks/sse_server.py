"""A minimal OpenAI-style SSE server on raw asyncio: zero delay by default, so a load generator's own limit
shows; optional seeded faults for failure tests. Run it in its own process:

    python -m bench.benchmarks.sse_server --port 8123 [--tokens 8] [--faults http_500=0.1,stall=0.05,...]

Faults (each a probability; the rest are answered normally): http_500, stall (headers and one token, then
silence), malformed (a data line that is not JSON), reset (TCP reset after two tokens), close (clean close after
two tokens, no [DONE]). `--token-delay S` spaces the tokens. `--log`: each answer's tokens name it (`r7 r7 ...`),
and GET /log lists every request (arrival, last token's time, the messages or prompt, the answer, headers, and
`disconnected`: when the client closed the connection before the answer's end).
Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import time

FAULTS = ("http_500", "stall", "malformed", "reset", "close")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
         b"Connection: keep-alive\r\n\r\n")
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Server(asyncio.Protocol):
    def __init__(self, opts: argparse.Namespace, rng: random.Random, counter: list[int]):
        self.opts, self.rng, self.counter = opts, rng, counter
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        entry = getattr(self, "entry", None)  # --log: the client left before this answer's end (a cancel)
        if entry is not None and not entry.get("done"):
            entry["disconnected"] = time.time()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            self.head = head
            self.handle(head.split(" ", 2)[1], body)

    def handle(self, path: str, body: bytes) -> None:
        t = self.transport
        if path.endswith("/v1/models"):
            payload = json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]}).encode()
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload))
            return
        if path.endswith("/log"):
            payload = json.dumps(self.opts.entries).encode()
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload))
            return
        if path.endswith("/stats"):  # how many completions it was sent: tests wait for load, not for a clock
            payload = json.dumps({"requests": self.counter[0]}).encode()
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload))
            return
        if path.endswith("/v1/embeddings"):
            req = json.loads(body or b"{}")
            self.counter[0] += 1
            if self.opts.log:
                self.opts.entries.append({"id": self.counter[0], "path": path, "arrived": time.time(), "body": req,
                                          "headers": self.head.split("\r\n")[1:]})
            n = len(str(req.get("input", "")).split())
            payload = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0,
                                                              "embedding": [0.0] * 8}],
                                  "usage": {"prompt_tokens": n, "total_tokens": n}}).encode()
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload))
            return
        if not path.endswith("completions"):
            t.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        if self.opts.require_key and f"authorization: bearer {self.opts.require_key}" not in self.head.lower():
            t.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            return
        req = json.loads(body or b"{}")
        self.counter[0] += 1
        fault = self.pick()
        if fault == "http_500":
            err = b'{"error":{"message":"injected failure","code":500}}'
            t.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(err), err))
            return
        n = min(int(req.get("max_tokens") or self.opts.tokens), self.opts.max_tokens)
        chat = path.endswith("/chat/completions")
        if not req.get("stream"):
            msg = {"message": {"role": "assistant", "content": "tok " * n}} if chat else {"text": "tok " * n}
            payload = json.dumps({"choices": [{"index": 0, **msg, "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}
                                 ).encode()
            t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload))
            return
        word = "tok "
        entry = None
        if self.opts.log:
            word = f"r{self.counter[0]} "
            entry = {"id": self.counter[0], "path": path, "arrived": time.time(), "last_token": None,
                     "body": req, "answer": word * n, "headers": self.head.split("\r\n")[1:]}
            self.opts.entries.append(entry)
            self.entry = entry
        tok = ({"choices": [{"index": 0, "delta": {"content": word}}]} if chat
               else {"choices": [{"index": 0, "text": word}]})
        token = _event(tok)
        usage = b"" if self.opts.no_usage else _event(
            {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}})
        if fault is None and self.opts.token_delay <= 0 and not self.opts.reasoning:
            if entry is not None:
                entry["last_token"], entry["done"] = time.time(), True
            t.write(_HEAD + token * n + usage + _DONE)
            return
        asyncio.get_running_loop().create_task(self.slow(fault, token, usage, n, entry))

    async def slow(self, fault: str | None, token: bytes, usage: bytes, n: int, entry: dict | None = None) -> None:
        t = self.transport
        t.write(_HEAD + _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        thinking = _event({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm "}}]})
        for k in range(n):
            if t.is_closing():  # the client went away (a run killed or stopped): nothing more to say
                return
            if k < self.opts.reasoning:
                t.write(thinking)
                await asyncio.sleep(self.opts.token_delay)
                continue
            if fault == "stall" and k == 1:
                await asyncio.sleep(3600)
            if fault in ("reset", "close", "malformed") and k == 2:
                if fault == "malformed":
                    t.write(_chunk(b"data: {this is not json\n\n"))
                    break
                if fault == "reset":  # SO_LINGER 0: close() sends RST
                    t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                          struct.pack("ii", 1, 0))
                    t.abort()
                    return
                t.write(b"0\r\n\r\n")
                t.close()
                return
            if entry is not None:
                entry["last_token"] = time.time()
            t.write(token)
            if self.opts.token_delay > 0:
                await asyncio.sleep(self.opts.token_delay)
        if not t.is_closing():
            t.write(usage + _DONE)
            if entry is not None:
                entry["done"] = True

    def pick(self) -> str | None:
        x = self.rng.random()
        for name, p in self.opts.fault_probs:
            if x < p:
                return name
            x -= p
        return None


def parse_faults(spec: str) -> list[tuple[str, float]]:
    out = []
    for part in filter(None, spec.split(",")):
        name, _, p = part.partition("=")
        if name not in FAULTS:
            raise SystemExit(f"unknown fault {name!r} (one of {', '.join(FAULTS)})")
        out.append((name, float(p)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per answer when the request gives no max_tokens")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--token-delay", type=float, default=0.0)
    ap.add_argument("--faults", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-usage", action="store_true", help="send no usage chunk (clients must count chunks)")
    ap.add_argument("--reasoning", type=int, default=0, help="the first N tokens are reasoning_content deltas")
    ap.add_argument("--log", action="store_true", help="keep every request (GET /log); tokens name their request")
    ap.add_argument("--require-key", default="", help="answer 401 unless 'Authorization: Bearer KEY' is sent")
    opts = ap.parse_args()
    opts.fault_probs = parse_faults(opts.faults)
    opts.entries = []  # --log: every request, shared by the connections
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        rng, counter = random.Random(opts.seed), [0]
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Server(opts, rng, counter), "127.0.0.1", opts.port, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"port": port, "started": time.time()}), flush=True)
        await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
