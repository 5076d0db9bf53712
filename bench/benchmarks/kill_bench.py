"""Rows kept when a run is killed, the way users and supervisors kill it: `capbench run` against the local stub
server (bench/benchmarks/sse_server.py, ~1 s answers so that many are in flight), killed at a random moment by
SIGTERM to its process group (`timeout`, `kill -- -PGID`, systemd), SIGTERM to its pid, or SIGKILL of the master;
one process and two local workers. Per case: the requests the server was sent, the rows stored, the rows lost
(sent, not stored) and the run's status. `--tree DIR` runs another checkout's code (e.g. `git archive REV | tar -x
-C DIR`) through the same script, for a before and after from one run.

    python -m bench.benchmarks.kill_bench [--trials 3] [--tree /tmp/before] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
KILLS = {
    "SIGTERM to the group": lambda p: os.killpg(p.pid, signal.SIGTERM),
    "SIGTERM to the pid": lambda p: p.send_signal(signal.SIGTERM),
    "SIGKILL of the master": lambda p: p.kill(),
}


def _served(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as r:
        return json.loads(r.read())["requests"]


def settled(db: Path, timeout_s: float = 90.0) -> tuple[str, int]:
    """The run's status and its rows once the recorder has marked the run (it may still hold the file)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                status = con.execute("SELECT status FROM runs").fetchone()[0]
                rows = con.execute("SELECT count(*) FROM requests").fetchone()[0]
            if status != "running":
                return status, rows
        except (duckdb.Error, TypeError):
            pass
        time.sleep(0.5)
    with duckdb.connect(str(db), read_only=True) as con:
        return "running (never marked)", con.execute("SELECT count(*) FROM requests").fetchone()[0]


def trial(url: str, folder: Path, workers: int, kill, rng: random.Random, tree: Path | None) -> tuple[int, int, str]:
    """(requests the server was sent, rows stored, run status) for one run killed at a random moment."""
    db = folder / f"k{rng.randrange(10**9)}.duckdb"
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", "from bench.cli import main; main()", "run", "--target", url,
                             "--rate", "20", "--duration", "30", "--db", str(db), "--no-live", "--workload",
                             "synthetic", "--workers", str(workers)], cwd=tree or ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        before = _served(url)
        deadline = time.monotonic() + 120
        while _served(url) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 2.5))
        kill(proc)
        proc.wait(timeout=90)
        time.sleep(1.0)  # workers and the recorder of a SIGKILLed master finish on their own
        status, rows = settled(db)
        return _served(url) - before, rows, status
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--tree", type=Path, help="another checkout's root, run through PYTHONPATH")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "bench.benchmarks.sse_server", "--token-delay", "0.05",
                               "--max-tokens", "20"], stdout=subprocess.PIPE, cwd=ROOT, text=True)
    url = f"http://127.0.0.1:{json.loads(server.stdout.readline())['port']}"
    rng = random.Random(a.seed)
    print(f"code: {a.tree or ROOT}; {a.trials} trials per case; seed {a.seed}")
    print(f"{'kill':<24} {'workers':>7} {'sent':>6} {'stored':>7} {'lost':>5}  statuses")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, kill in KILLS.items():
                for workers in (0, 2):
                    results = [trial(url, Path(tmp), workers, kill, rng, a.tree) for _ in range(a.trials)]
                    sent, stored = sum(r[0] for r in results), sum(r[1] for r in results)
                    lost = sum(max(0, r[0] - r[1]) for r in results)
                    print(f"{name:<24} {workers:>7} {sent:>6} {stored:>7} {lost:>5}  "
                          f"{', '.join(sorted({r[2] for r in results}))}", flush=True)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
