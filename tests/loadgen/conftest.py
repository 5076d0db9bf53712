import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gevent
import pytest
from locust.env import Environment

from loadgen import workloads
from loadgen.worker import locust_options

ROOT = Path(__file__).resolve().parents[2]


class StubServer:
    """bench/benchmarks/sse_server.py in its own process."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.benchmarks.sse_server", *args],
                                     stdout=subprocess.PIPE, cwd=ROOT, text=True)
        self.port = json.loads(self.proc.stdout.readline())["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def count(self) -> int:
        """Completions requests the server was sent so far."""
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as r:
            return json.loads(r.read())["requests"]

    def wait_for(self, n: int, timeout_s: float = 120.0) -> None:
        """Until the server was sent n requests: a loaded machine starts a run in seconds, not a fixed time."""
        deadline = time.monotonic() + timeout_s
        while self.count() < n:
            assert time.monotonic() < deadline, f"the server was sent {self.count()} requests, not {n}"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def stub_server():
    servers = []

    def start(*args: str) -> StubServer:
        servers.append(StubServer(*args))
        return servers[-1]

    yield start
    for s in servers:
        s.kill()


def plan_config(url: str, profile: dict, workload: dict | None = None, **kw) -> dict:
    wl = workloads.from_dict(workload or {"name": "t", "input": 16, "output": 4})
    cfg = {"target": url, "model": "stub-model", "stream": True, "profile": profile, "workload": wl.to_dict(),
           "seed": 1, "warmup_s": 0.0, "workers": 1, "t0": time.time() + 0.3, "duration_s": 1.0,
           "connections": 64, "timeout_s": 10.0}
    cfg.update(kw)
    return cfg


class Records(list):
    """The records fired, in order; `contexts` holds each Locust event's whole context."""

    contexts: list


def drive(user_class, cfg: dict, users: int, seconds: float) -> Records:
    """Run Locust users of this config for `seconds` after t0 (then kill them); the records they fired."""
    env = Environment(user_classes=[user_class], parsed_options=locust_options(cfg), stop_timeout=0.0)
    env.create_local_runner()
    records = Records()
    records.contexts = []

    def on_request(context=None, **_kw):
        records.append(context["capbench"])
        records.contexts.append(context)

    env.events.request.add_listener(on_request)
    env.runner.start(users, spawn_rate=users)
    gevent.sleep(max(0.0, cfg["t0"] - time.time()) + seconds)
    env.runner.quit()
    return records
