"""A stand-in for `capbench sglang-launch` on a GPU host: given the launch command capbench filled in, it serves the
OpenAI API (a twin of the model, tp and KV dtype the command asks for, or --serve-kv's: a server that is not the one
launched) on --port after --delay seconds, or fails to start, or dies mid-run. Writes its own pid and its server's to
--pids so a test can check both were stopped."""

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--delay", type=float, default=0.5)
p.add_argument("--mode", choices=("ok", "fail", "die"), default="ok")
p.add_argument("--die-after", type=float, default=4.0)
p.add_argument("--pids", required=True)
p.add_argument("--ports", default=None, help="append '<tag> <port>' here when serving")
p.add_argument("--tag", default="")
p.add_argument("--serve-kv", default=None, help="the KV dtype the twin serves, whatever the command asked")
p.add_argument("--wait-for", default=None, help="start serving only once this file exists (a test's gate)")
p.add_argument("command", nargs=argparse.REMAINDER)
a = p.parse_args()
print("launch command:", " ".join(a.command), flush=True)
assert "sglang-launch" in a.command and "--port" in a.command, "capbench did not fill in the launch command"
Path(a.pids).open("a").write(f"{__import__('os').getpid()}\n")
time.sleep(a.delay)
while a.wait_for and not Path(a.wait_for).exists():
    time.sleep(0.1)
if a.mode == "fail":
    print("RuntimeError: CUDA out of memory while loading the weights (fake)", flush=True)
    sys.exit(1)
asked = dict(zip(a.command, a.command[1:], strict=False))
kv = a.serve_kv or {"auto": "bf16"}.get(asked["--kv-cache-dtype"], asked["--kv-cache-dtype"])
twin = subprocess.Popen([sys.executable, "-c", "from bench.cli import main; main()", "twin", "--model", "glm-4.6",
                         "--tp", asked["--tp"], "--kv-dtype", kv, "--port", str(a.port), "--time-scale", "50"],
                        stdout=sys.stdout, stderr=sys.stderr)
Path(a.pids).open("a").write(f"{twin.pid}\n")
if a.ports:
    Path(a.ports).open("a").write(f"{a.tag} {a.port}\n")
if a.mode == "die":  # mid-run: --die-after seconds after it first answered /health
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(a.die_after)
    twin.kill()
    print("fake: the server died", flush=True)
    sys.exit(3)
twin.wait()
