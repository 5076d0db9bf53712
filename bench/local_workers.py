"""A run's local Locust worker processes: started with a pipe of their own to the recorder, waited for, reaped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import gevent
from locust.env import Environment

from bench.errors import BadInput
from loadgen.frames import PIPE_FD_ENV


def spawn(feeds: list[int], port: int) -> list[subprocess.Popen]:
    """One worker per feed (the write end of its pipe to the recorder)."""
    cmd = [sys.executable, "-m", "loadgen.worker", "--master-host", "127.0.0.1", "--master-port", str(port),
           "--parent-pid", str(os.getpid())]
    # cwd: the checkout, for imports; every path in the run's config is absolute already (the CLI resolved them)
    return [subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent, pass_fds=(fd,),
                             env={**os.environ, PIPE_FD_ENV: str(fd)}) for fd in feeds]


def reap(procs: list[subprocess.Popen]) -> None:
    """Workers leave on the master's quit message; whoever has not after 10 s is terminated (signalled twice: it
    writes its records and leaves), then killed."""
    deadline = time.time() + 10
    for p in procs:
        while p.poll() is None and time.time() < deadline:
            gevent.sleep(0.1)
        if p.poll() is None:
            p.terminate()
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_for(env: Environment, n: int, procs: list, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while len(env.runner.clients.ready) < n:
        if any(p.poll() is not None for p in procs):
            raise BadInput("a local Locust worker process exited before the run started")
        if time.time() > deadline:
            raise BadInput(f"only {len(env.runner.clients.ready)} of {n} workers joined within {timeout_s:.0f}s")
        gevent.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
