"""Kills at random moments, the way users and supervisors send them, against the stub server: every request the
server was sent has its row. SIGTERM to the process group (`timeout`, `kill -- -PGID`, systemd) reaches the recorder
and the local workers too; SIGKILL of the master leaves its local workers and recorder to finish the rows."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.benchmarks.kill_bench import settled
from tests.loadgen.conftest import StubServer

CAPBENCH = str(Path(sys.executable).parent / "capbench")


@pytest.fixture
def server():
    srv = StubServer("--token-delay", "0.05", "--max-tokens", "20")  # ~1 s answers: many in flight at any kill
    yield srv
    srv.kill()


def _kill_at_random(server: StubServer, tmp_path: Path, workers: int, kill, seed: int) -> tuple[int, int, str]:
    db = tmp_path / f"k{seed}.duckdb"
    proc = subprocess.Popen([CAPBENCH, "run", "--target", server.url, "--rate", "20", "--duration", "30", "--db",
                             str(db), "--no-live", "--workload", "synthetic", "--workers", str(workers)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    children: list[psutil.Process] = []
    try:
        before = server.count()
        server.wait_for(before + 3)
        time.sleep(random.Random(seed).uniform(0.0, 2.5))
        children = psutil.Process(proc.pid).children(recursive=True)
        kill(proc)
        proc.wait(timeout=60)
        status, rows = settled(db)
        return server.count() - before, rows, status
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for c in children:  # nothing should be left; never leave anything behind either
            try:
                c.wait(timeout=30)
            except psutil.TimeoutExpired:
                c.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.parametrize("workers", [0, 2])
def test_sigterm_to_the_process_group_keeps_every_row(server, tmp_path, workers):
    seed = random.randrange(10**6)
    for trial in range(2):
        sent, rows, status = _kill_at_random(server, tmp_path, workers,
                                             lambda p: os.killpg(p.pid, signal.SIGTERM), seed + trial)
        # a request cut off between its announcement and its write has a `cancelled` row the server never saw
        assert status == "aborted" and sent >= 3 and rows >= sent, (seed, trial, sent, rows, status)


def test_sigkill_of_the_master_loses_no_row_of_its_local_workers(server, tmp_path):
    seed = random.randrange(10**6)
    for trial in range(2):
        sent, rows, status = _kill_at_random(server, tmp_path, 2, lambda p: p.kill(), seed + trial)
        assert status == "aborted" and sent >= 3 and rows >= sent, (seed, trial, sent, rows, status)
