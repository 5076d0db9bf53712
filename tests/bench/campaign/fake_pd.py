"""A stand-in for one role of a disaggregated SGLang deployment on a GPU node: given the command capbench filled in
(`python -m sglang.launch_server --disaggregation-mode prefill|decode ...` or `python -m sglang_router.launch_router
--pd-disaggregation ...`), it serves on the command's --port: /health, /get_server_info (the mode, tp and KV dtype
the command asks for, or --say-mode's: a server that is not the one launched), /v1/models and streaming
/v1/chat/completions; the router also /workers as sglang-router 0.3.2 lists them (--say-decode: a router that names
another decode server). The router waits for its workers' /health, then sends each request to a prefill server (one
token) and streams the answer from a decode server. --mode fail exits at start, --mode die --die-after seconds
after its first request; --hold FILE waits while FILE exists. Every process writes its pid to --pids; every
request served appends '<mode> <port>' to --served."""

import argparse
import http.client
import itertools
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--pids", required=True)
p.add_argument("--served", default=os.devnull)
p.add_argument("--mode", choices=("ok", "fail", "die"), default="ok")
p.add_argument("--delay", type=float, default=0.2)
p.add_argument("--die-after", type=float, default=3.0)
p.add_argument("--say-mode", default=None)
p.add_argument("--say-decode", default=None, help="the router lists this URL as its decode worker instead")
p.add_argument("--hold", default=None, help="start serving only once this file is gone")
p.add_argument("command", nargs=argparse.REMAINDER)
a = p.parse_args()
cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
print("launch command:", " ".join(cmd), flush=True)
with Path(a.pids).open("a") as f:
    f.write(f"{os.getpid()}\n")
router = "sglang_router.launch_router" in cmd
args = dict(zip(cmd, cmd[1:], strict=False))
port = int(args["--port"])
mode = "router" if router else args["--disaggregation-mode"]
time.sleep(a.delay)
while a.hold and Path(a.hold).exists():
    time.sleep(0.1)
if a.mode == "fail":
    print(f"RuntimeError: the {mode} server failed to start (fake)", flush=True)
    sys.exit(1)
prefill = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--prefill"]
decode = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--decode"]
turn = itertools.count()
if router:  # as sglang-router does: the workers answer before the router does
    for url in prefill + decode:
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)


def served() -> None:
    with Path(a.served).open("a") as f:
        f.write(f"{mode} {port}\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def _json(self, obj: object, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._json({})
        elif self.path == "/get_server_info" and not router:
            self._json({"model_path": args["--model-path"], "tp_size": int(args["--tp"]),
                        "kv_cache_dtype": args["--kv-cache-dtype"], "disaggregation_mode": a.say_mode or mode,
                        "max_total_num_tokens": 100000})
        elif self.path == "/workers" and router:
            listed = [(u, "prefill") for u in prefill] + [(u, "decode") for u in ([a.say_decode] if a.say_decode
                                                                                 else decode)]
            self._json({"workers": [{"id": str(k), "url": u, "worker_type": t, "is_healthy": True, "load": 0,
                                     "connection_mode": "http"} for k, (u, t) in enumerate(listed)],
                        "total": len(listed)})
        elif self.path == "/v1/models":
            model = args.get("--model-path") or "fake"
            self._json({"object": "list", "data": [{"id": model, "root": model, "object": "model"}]})
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/chat/completions":
            return self._json({"error": "not found"}, 404)
        served()
        if a.mode == "die":
            with first:
                if not dying.is_alive():
                    dying.start()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if router:
            return self._route(body)
        n = 1 if mode == "prefill" else min(int(body.get("max_tokens") or 8), 8)
        for k in range(n):
            time.sleep(0.005)
            self._chunk({"choices": [{"index": 0, "delta": {"content": f"t{k} "}}]})
        self._chunk({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}})
        self._send(b"data: [DONE]\n\n")
        self._send(b"")

    def _route(self, body: dict) -> None:
        k = next(turn)
        for url, stream in ((prefill[k % len(prefill)], False), (decode[k % len(decode)], True)):
            host, _, wport = url.removeprefix("http://").partition(":")
            con = http.client.HTTPConnection(host, int(wport), timeout=30)
            con.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = con.getresponse()
            for line in resp:  # http.client undoes the worker's chunking
                if stream and line.strip():
                    self._send(line + b"\n")
            con.close()
        self._send(b"")

    def _chunk(self, obj: dict) -> None:
        self._send(f"data: {json.dumps(obj)}\n\n".encode())

    def _send(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def die() -> None:
    print("fake: the server died", flush=True)
    os._exit(3)


dying, first = threading.Timer(a.die_after, die), threading.Lock()
server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
server.serve_forever()
