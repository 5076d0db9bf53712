"""Nothing a campaign launched on this host outlives it, however its runner ends (SIGKILL included).

Every process a campaign starts here carries a mark in its environment (own.MARK: the DB and campaign id; the
runner puts it in its own environment for its twins, load workers and eval processes, and spawn gives each launch
one more, LAUNCH, of its own), and children inherit it: a server that leaves its process group (`setsid`) or
daemonizes keeps it. So:
- stop_launch() ends one launch's marked processes after its process group is stopped (launch.halt);
- a watchdog process per campaign, in a session of its own, waits on a pipe from the runner; when the pipe closes
  (the runner finished, or died however it died) it ends every process carrying the campaign's mark.
Processes are signalled one by one, never by group: a marked process may share its group with whoever started the
runner. Only standard-library imports: the watchdog runs this file as a script (`python -I`: not
beside bench/campaign/queue.py, which would shadow the standard library's queue).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LAUNCH = "CAPBENCH_LAUNCH"  # in one launch's environment: its own id, so its stop finds what left its group


def marked_pids(item: str) -> list[int]:
    """Live (not zombie) processes whose environment holds exactly `item` (NAME=value), this one excepted."""
    want, out = item.encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        out.append(int(entry.name))
    return out


def end_marked(item: str, grace_s: float) -> int:
    """SIGTERM to every process marked `item`, up to grace_s for them to go, then SIGKILL; returns how many."""
    pids = marked_pids(item)
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := marked_pids(item)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        _kill(pid, signal.SIGKILL)
    return len(pids)


def stop_launch(launch_id: str, grace_s: float) -> int:
    """The processes of one launch still running after its group was stopped (a `setsid` server, say)."""
    return end_marked(f"{LAUNCH}={launch_id}", grace_s)


def start(mark: str, grace_s: float) -> subprocess.Popen:
    """The campaign's watchdog: it ends every process marked `mark` once its stdin (kept open by the runner, and
    closed by the kernel when the runner dies) reaches EOF. Call close() when the campaign is done."""
    env = {k: v for k, v in os.environ.items() if k != mark.split("=", 1)[0]}
    return subprocess.Popen([sys.executable, "-I", __file__, mark, str(grace_s)], stdin=subprocess.PIPE, env=env,
                            stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def close(watchdog: subprocess.Popen, grace_s: float) -> None:
    """The campaign is over: the watchdog sweeps once more (what left its group) and is waited for."""
    watchdog.stdin.close()
    try:
        watchdog.wait(timeout=grace_s + 30)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(mark: str, grace_s: float) -> None:
    for s in (signal.SIGINT, signal.SIGHUP):  # a Ctrl-C meant for the campaign is the runner's to handle
        signal.signal(s, signal.SIG_IGN)
    while sys.stdin.buffer.read(1):
        pass
    n = end_marked(mark, grace_s)
    if n:
        try:
            print(f"capbench watchdog: ended {n} process(es) the campaign left ({mark})", file=sys.stderr, flush=True)
        except OSError:  # the runner's terminal or pipe is gone with it
            pass


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
