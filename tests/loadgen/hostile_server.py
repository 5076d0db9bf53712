"""A server that answers with what a load generator must survive: valid JSON of the wrong shape, token counts that fit
no column, an event too large, the caller's API key echoed back. Faults are served in turn, one per request:

    python -m tests.loadgen.hostile_server --faults delta_string,usage_string,...   (prints {"port": N})

Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json

OK_CHUNK = {"choices": [{"delta": {"content": "a"}}]}
# fault -> the SSE events of a streamed answer (before [DONE]); the non-streamed answer is the last one
EVENTS = {
    "delta_string": [{"choices": [{"delta": "abc"}]}],
    "usage_string": [OK_CHUNK, {"choices": [], "usage": "lots"}],
    "choices_dict": [{"choices": {"first": 1}}],
    "choice_string": [{"choices": ["x"]}],
    "json_list": [[1, 2]],
    "details_string": [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                           "prompt_tokens_details": "none"}}],
    "int32_overflow": [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": 2**31 + 5, "completion_tokens": 1}}],
    "huge_int": [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": 10**30, "completion_tokens": 1}}],
    "negative_tokens": [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": -4, "completion_tokens": 1.5}}],
    "ok": [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}],
}
BIG_EVENT_BYTES = 3 << 20


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, faults: list[str],
                 counter: list[int], models: bytes) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            path = lines[0].split(" ")[1]
            if path.endswith("/v1/models"):
                _reply(writer, 200, models)
            elif path.endswith("/capbench-count"):  # how many completions requests came (the test's "sent")
                _reply(writer, 200, json.dumps({"requests": counter[0]}).encode())
            elif not path.endswith("completions"):  # /metrics, /server_info: no such thing here
                _reply(writer, 404, b"")
            else:
                fault = faults[counter[0] % len(faults)]
                counter[0] += 1
                await _answer(writer, fault, json.loads(body or b"{}"), headers.get("authorization", ""))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _reply(writer: asyncio.StreamWriter, status: int, payload: bytes, ctype: str = "application/json") -> None:
    writer.write(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                 % (status, ctype.encode(), len(payload), payload))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _answer(writer: asyncio.StreamWriter, fault: str, req: dict, auth: str) -> None:
    if fault == "echo_key":  # an error page that quotes the request's credentials
        _reply(writer, 401, f"invalid credentials: Authorization: {auth} (key {auth.split(' ')[-1]})".encode(),
               "text/plain")
        return
    key = auth.split(" ")[-1]
    echoes = {"echo_key_json": json.dumps({"error": {"message": "bad key", "key": key}}).replace("/", "\\/"),
              "echo_key_upper": f"INVALID KEY {key.upper()}", "echo_key_prefix": f"invalid key {key[:12]}...",
              "echo_key_urlencoded": "invalid key " + __import__("urllib.parse").parse.quote(key, safe=""),
              "echo_key_unicode": '{"detail": "bad key ' + "".join(f"\\u{ord(c):04x}" for c in key) + '"}',
              "echo_key_base64": "invalid key " + __import__("base64").b64encode(key.encode()).decode(),
              "echo_key_hex": "invalid key " + key.encode().hex(), "echo_key_reversed": "invalid key " + key[::-1],
              "echo_key_spaced": "invalid key " + " ".join(key),
              "echo_key_html": "<p>invalid key " + "".join(f"&#{ord(c)};" for c in key) + "</p>",
              "echo_key_percent": "invalid key " + "".join(f"%{b:02X}" for b in key.encode()),
              "echo_key_pieces": f"invalid key {key[:7]} ... {key[7:14]} ... {key[14:21]}"}
    if fault in echoes:  # the forms a key takes in a server's error page
        _reply(writer, 403, echoes[fault].encode(), "text/plain")
        return
    events = EVENTS.get(fault, [])
    if fault == "echo_key_usage":  # the key in a field the client quotes in its note
        events = [OK_CHUNK, {"choices": [], "usage": {"prompt_tokens": key, "completion_tokens": 1}}]
    if fault == "echo_key_stream":
        events = [OK_CHUNK, {"error": {"message": f"rate limited for {auth}"}}]
    if not req.get("stream"):  # one answer: the last event, with a message if it carries only the usage
        last = events[-1]
        if isinstance(last, dict) and last.get("choices") == [] and "usage" in last:
            last = {"choices": [{"message": {"content": "a"}}], "usage": last["usage"]}
        _reply(writer, 200, json.dumps(last).encode())
        return
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    if fault == "slow":  # ten tokens a tenth of a second apart: a second in flight
        for _ in range(10):
            writer.write(_chunk(b"data: " + json.dumps(OK_CHUNK).encode() + b"\n\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
    if fault == "big_event":
        writer.write(_chunk(b"data: " + b"x" * BIG_EVENT_BYTES))  # and never the blank line that would end it
        await writer.drain()
        await asyncio.sleep(0.5)
    for e in events:
        writer.write(_chunk(b"data: " + json.dumps(e).encode() + b"\n\n"))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--faults", default="ok")
    ap.add_argument("--models", default=json.dumps({"data": [{"id": "hostile-model"}]}), help="/v1/models body")
    args = ap.parse_args()
    faults, models = args.faults.split(","), args.models.encode()
    counter = [0]

    async def serve() -> None:
        server = await asyncio.start_server(lambda r, w: handle(r, w, faults, counter, models), "127.0.0.1", 0,
                                            limit=1 << 20)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
        await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
