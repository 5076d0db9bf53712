"""How fast is the twin itself? The twin runs in its own process pinned to one core (`capbench twin`), the client
in another process on another core: a raw asyncio HTTP/1.1 keep-alive loop (no client library), so the client
is not the limit.

1. overhead: sequential tiny requests at time scale 1e6 (modelled time ~0): the median end-to-end latency is
   what the twin itself costs a request; and at time scale 1, one 64-token stream: measured end-to-end minus
   the modelled latency, per token;
2. throughput: the most streamed tiny requests (a 6-word prompt, 4 output tokens, one SSE chunk each, usage
   chunk, [DONE]) per second it serves on one core at time scale 1e4, closed loop with many connections.
   Goal: >= 2000 req/s. Median of --repeat runs. Also printed: the client's and the twin's CPU use (1.0 = a
   whole core) and the machine's load average: on a shared machine the figures move with the neighbours.

    python -m bench.benchmarks.twin_bench [--duration 5] [--connections 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TINY = {"model": "m", "prompt": "the quick brown fox jumps over", "max_tokens": 4, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}
END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def start_twin(port: int, time_scale: float, core: int | None) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).parent / "capbench"), "twin", "--port", str(port), "--time-scale",
           str(time_scale)]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health")
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("twin did not start")


def request_bytes(port: int, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (port, len(raw), raw))


async def closed_loop(port: int, connections: int, duration: float) -> tuple[int, int]:
    """Each connection sends the next request when the last one's [DONE] arrived. Returns (done, failed)."""
    payload = request_bytes(port, TINY)
    done = failed = 0
    stop = time.perf_counter() + duration

    async def conn() -> None:
        nonlocal done, failed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(payload)
            buf = b""
            while not buf.endswith(END):
                data = await reader.read(65536)
                if not data:
                    failed += 1
                    return
                buf += data
            if b" 200 OK" in buf[:20] and buf.count(b"data: {") == 5:  # 4 tokens + usage
                done += 1
            else:
                failed += 1
        writer.close()

    await asyncio.gather(*(conn() for _ in range(connections)))
    return done, failed


def twin_process(proc: subprocess.Popen) -> int:
    """The twin's own pid: taskset execs it, so it is proc's pid."""
    return proc.pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (taskset execs the twin: same pid)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_queue_seconds(pid: int) -> float:
    """Seconds the twin's threads were runnable but waiting for a CPU (/proc/PID/task/*/schedstat)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[1]) / 1e9
    return total


def overhead(port_base: int) -> dict:
    twin = start_twin(port_base, 1e6, None)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port_base}") as c:
            lat = []
            for _ in range(300):
                t = time.perf_counter()
                c.post("/v1/completions", json={**TINY, "stream": False})
                lat.append(time.perf_counter() - t)
    finally:
        twin.terminate()
        twin.wait()
    twin = start_twin(port_base + 1, 1.0, None)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port_base + 1}", timeout=60) as c:
            info = c.get("/server_info").json()
            per_token = []
            for _ in range(3):
                body = {**TINY, "stream": False, "max_tokens": 64}
                t = time.perf_counter()
                r = c.post("/v1/completions", json=body)
                e2e = time.perf_counter() - t
                rec = c.get(f"/capbench/requests/{r.headers['x-capbench-request-id']}").json()
                per_token.append((e2e - modelled_s(info, 64)) / 64)
                server_side = rec["finish"] - rec["arrival"]
    finally:
        twin.terminate()
        twin.wait()
    return {"tiny_e2e_ms": statistics.median(lat) * 1e3, "tiny_e2e_p90_ms": sorted(lat)[269] * 1e3,
            "overhead_per_token_ms": statistics.median(per_token) * 1e3, "server_side_s": server_side,
            "modelled_s": modelled_s(info, 64)}


def modelled_s(info: dict, tokens: int) -> float:
    """The perf model's latency of a lone request: one prefill step, then tokens - 1 decode steps."""
    from bench.model import Deployment, Efficiency, PerfModel, catalog, perfmodel

    twin = info["capbench"]["twin"]
    dep = Deployment(catalog.model(twin["model"]), catalog.gpu(twin["gpu"]), twin["tp"], twin["dp"],
                     twin["kv_dtype"], twin["weights"])
    pm = PerfModel(dep, Efficiency(**info["capbench"]["efficiency"]))
    prompt = 6
    first = pm.step_time(0, 0, prompt, perfmodel.prefill_pairs(prompt, 0), prompt)
    return first + sum(pm.step_time(1, prompt + i) for i in range(1, tokens))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=31800)
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    o = overhead(a.port)
    print(f"twin overhead: tiny non-streamed request (4 tokens, time scale 1e6) median {o['tiny_e2e_ms']:.2f} ms, "
          f"p90 {o['tiny_e2e_p90_ms']:.2f} ms end to end (client included)")
    print(f"twin overhead at time scale 1: a 64-token request took {o['server_side_s']:.3f} s server-side vs "
          f"{o['modelled_s']:.3f} s modelled; measured - modelled = {o['overhead_per_token_ms']:.3f} ms per token "
          "(median of 3, client included)")
    cores = os.sched_getaffinity(0)
    twin_core, client_core = (sorted(cores)[0], sorted(cores)[1]) if len(cores) > 1 else (None, None)
    twin = start_twin(a.port + 2, 1e4, twin_core)
    if client_core is not None:
        os.sched_setaffinity(0, {client_core})
    rates, twin_cpu, client_cpu, starved, failures = [], [], [], [], 0
    try:
        asyncio.run(closed_loop(a.port + 2, 8, 1.0))  # warm-up
        for _ in range(a.repeat):
            twin_pid = twin_process(twin)
            c0, t0, w0, q0 = time.process_time(), time.perf_counter(), cpu_seconds(twin.pid), run_queue_seconds(
                twin_pid)
            done, failed = asyncio.run(closed_loop(a.port + 2, a.connections, a.duration))
            wall = time.perf_counter() - t0
            rates.append(done / wall)
            client_cpu.append((time.process_time() - c0) / wall)
            twin_cpu.append((cpu_seconds(twin.pid) - w0) / wall)
            starved.append((run_queue_seconds(twin_pid) - q0) / wall)
            failures += failed
    finally:
        twin.terminate()
        twin.wait()
    pinned = f"twin pinned to CPU {twin_core}, client to CPU {client_core}" if twin_core is not None else "unpinned"
    print(f"streamed tiny requests/s on one core (time scale 1e4, {a.connections} connections, {pinned}), median of "
          f"{a.repeat}: {statistics.median(rates):,.0f} req/s (runs: {', '.join(f'{r:,.0f}' for r in rates)}); "
          f"goal >= 2,000; failed {failures}")
    print(f"CPU use (1.0 = one core): twin {statistics.median(twin_cpu):.2f}, "
          f"client {statistics.median(client_cpu):.2f}; the twin waited for a CPU "
          f"{statistics.median(starved):.2f} s per s (the neighbours' load)")
    per_cpu = statistics.median(r / c for r, c in zip(rates, twin_cpu, strict=True))
    print(f"requests per twin CPU-second (what one whole core would serve if the twin were CPU-bound): "
          f"{per_cpu:,.0f}")


if __name__ == "__main__":
    main()
