"""One runner per campaign, and every server a campaign launched owned by it.

- lock(): an flock on a file beside the DB, held while the runner lives; the kernel drops it when the runner dies,
  SIGKILL included. A second runner of a campaign (a `--resume` beside the live one, or two resumes after a kill) is
  refused, naming the holder.
- Each launched process group is recorded in the DB (campaign_servers, with the template's stop command) before
  the health wait. A runner starting on a DB first stops what a dead campaign left behind (stop_leftovers): the stop
  command, then stop_group; it refuses, naming the pids, when it cannot (another host, another user's processes).
- stop_group(): SIGTERM to the group, a grace period for SGLang's own shutdown, then SIGKILL.
- identity(): the server's own account of itself (/server_info, /get_server_info, or /v1/models) against the
  deployment; a server that is not the one launched fails the cell with both identities shown.
Every function here takes one process group or one server, so a deployment of several processes (prefill and
decode servers) calls them once per process.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx

from bench import http
from bench.campaign import watchdog
from bench.errors import BadInput
from bench.store import Store

STOP_TIMEOUT = "CAPBENCH_STOP_TIMEOUT_S"  # seconds a template's stop command gets (default 120)
MARK = "CAPBENCH_LAUNCHED_BY"  # in a launched server's environment (and its children's): "<db>|<campaign id>"


def mark(db: Path, cid: str) -> dict[str, str]:
    """The environment entry a launched server carries, so its runner's successor finds it even if the runner died
    between starting it and recording it."""
    return {MARK: f"{Path(db).resolve()}|{cid}"}


def marked(db: Path) -> dict[str, set[int]]:
    """Processes on this host carrying a mark of this DB, by campaign id."""
    prefix = f"{MARK}={Path(db).resolve()}|".encode()
    out: dict[str, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        for item in env.split(b"\0"):
            if item.startswith(prefix):
                out.setdefault(item[len(prefix):].decode(errors="replace"), set()).add(int(entry.name))
    return out


def mark_item(db: Path, cid: str) -> str:
    """The mark as one NAME=value environment entry."""
    return "=".join(next(iter(mark(db, cid).items())))


def lock_path(db: Path, cid: str) -> Path:
    return db.parent / f".{db.name}.{cid}.lock"


def lock(db: Path, cid: str) -> IO:
    """Holds the campaign for this process (keep the returned file open), or BadInput naming who holds it."""
    path = lock_path(db, cid)
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise BadInput(f"campaign {cid} is being run by {holder}; a second runner is refused (wait for it, or stop "
                       "it and --resume)") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}")
    f.flush()
    return f


def held(db: Path, cid: str) -> bool:
    """Whether a live runner holds the campaign (tried without waiting, and let go at once)."""
    path = lock_path(db, cid)
    if not path.exists():
        return False
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc): with the pid, who it is; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def stop_group(pgid: int, grace_s: float, note: Callable[[str], None] = lambda _: None,
               reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to the group, up to grace_s for it to end (SGLang shuts down its schedulers), then SIGKILL.
    `reap` collects our own child so it does not linger as a zombie."""
    if not _signal(pgid, signal.SIGTERM):
        return
    note(f"capbench: SIGTERM to process group {pgid}; waiting up to {grace_s:g} s for it to shut down")
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not group_members(pgid):
            note(f"capbench: process group {pgid} ended")
            return
        time.sleep(0.2)
    note(f"capbench: process group {pgid} still running after {grace_s:g} s: SIGKILL")
    _signal(pgid, signal.SIGKILL)
    reap()


def _signal(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def record_server(store: Store, cid: str, deployment: str, proc: subprocess.Popen, stop_command: str | None,
                  log: Path | None) -> None:
    with store.connect() as con:
        con.execute("INSERT INTO campaign_servers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                    [cid, deployment, proc.pid, proc.pid, socket.gethostname(), proc_start(proc.pid),
                     stop_command, str(log) if log else None, time.time()])


def server_stopped(store: Store, cid: str, pid: int) -> None:
    with store.connect() as con:
        con.execute("UPDATE campaign_servers SET stopped_at = ? WHERE campaign_id = ? AND pid = ?",
                    [time.time(), cid, pid])


def stop_leftovers(store: Store, db: Path, grace_s: float, say: Callable[[str], None], mine: str = "") -> int:
    """Stops the servers of campaigns whose runner is gone (and those of `mine`, the campaign this runner has just
    taken over, before it launches anything); returns how many groups were stopped. BadInput naming the pids when
    some cannot be stopped from here."""
    with store.connect() as con:
        rows = con.execute("SELECT campaign_id, deployment, pid, pgid, hostname, proc_start, stop_command, log "
                           "FROM campaign_servers WHERE stopped_at IS NULL").fetchall()
    here, stopped, refused = socket.gethostname(), 0, []
    for cid, dep, pid, pgid, host, started, stop_command, log in rows:
        if cid != mine and held(db, cid):
            continue  # its runner lives and owns it
        if host != here:
            refused.append(f"{dep} of campaign {cid}: process group {pgid} on {host}")
            continue
        leader = proc_start(pid)
        ours = group_members(pgid) and (leader is None or leader == started)  # a reused pid is someone else's
        if not ours and not stop_command:
            server_stopped(store, cid, pid)
            continue
        say(f"stopping what campaign {cid} left running: {dep} (process group {pgid}"
            f"{', pids ' + ' '.join(map(str, group_members(pgid))) if ours else ''})")
        with open(log or os.devnull, "a") as out:
            if stop_command:
                run_stop_command(stop_command, out)
            if ours:
                try:
                    stop_group(pgid, grace_s, lambda line: print(line, file=out, flush=True))
                except PermissionError:
                    refused.append(f"{dep} of campaign {cid}: pids {' '.join(map(str, group_members(pgid)))} "
                                   "(not ours to stop)")
                    continue
        server_stopped(store, cid, pid)
        stopped += 1
    for cid, pids in marked(db).items():  # launched but not recorded, or out of their group: one by one
        if cid != mine and held(db, cid):
            continue
        say(f"stopping what campaign {cid} left running: pids {' '.join(map(str, sorted(pids)))} (not recorded, "
            "or out of their process group)")
        stopped += watchdog.end_marked(mark_item(db, cid), grace_s)
    if refused:
        raise BadInput("servers a dead campaign left running cannot be stopped from here; stop them first: "
                       + "; ".join(refused))
    return stopped


def stop_timeout_s() -> float:
    """CAPBENCH_STOP_TIMEOUT_S, checked: BadInput in one line when it is not seconds from 1 to a day."""
    from bench.checks import env_seconds

    return env_seconds(STOP_TIMEOUT, 120.0, low=1.0, high=86400.0)


def stop_orphans(db: Path, say: Callable[[str], None]) -> int:
    """`capbench campaign --stop-orphans`: what campaigns whose runner is gone left running, stopped now."""
    if not Path(db).is_file():
        raise BadInput(f"--db {db}: no such DB")
    stop_timeout_s()
    return stop_leftovers(Store(db), Path(db), 30.0, say)


def run_stop_command(command: str, out: IO) -> None:
    limit = stop_timeout_s()
    out.write(f"$ {command}\n")
    out.flush()
    stopper = subprocess.Popen(command, shell=True, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stopper.wait(timeout=limit)
    except subprocess.TimeoutExpired:  # a hung stop command is killed with its children
        try:
            os.killpg(stopper.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stopper.wait()
        out.write(f"the stop command did not finish within {limit:g} s: killed\n")


def identity(url: str) -> dict:
    """What the server says it is: model path, tp, KV dtype, disaggregation mode (prefill, decode, or
    colocated: SGLang's "null"), KV pool (tokens); {} when it says nothing."""
    for path in ("/server_info", "/get_server_info"):
        try:
            r = http.get(url + path, timeout=10)
            if r.status_code == 200 and isinstance(info := r.json(), dict):
                kv = info.get("kv_cache_dtype")
                mode = info.get("disaggregation_mode")
                return {"model": info.get("model_path"), "tp": info.get("tp_size"),
                        "kv_dtype": "bf16" if kv in ("auto", "bfloat16", "bf16") else kv,
                        "mode": "colocated" if mode == "null" else mode, "pool": info.get("max_total_num_tokens")}
        except (httpx.HTTPError, ValueError):
            continue
    try:
        data = http.get(url + "/v1/models", timeout=10).json()["data"][0]
        return {"model": data.get("root") or data.get("id")}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return {}


def mismatch(expected: dict, actual: dict) -> str | None:
    """None when every fact the server states agrees with the deployment's; else both identities in one line.
    A model path agrees when its last component does (a local copy of the published checkpoint)."""
    if not actual:
        return None  # a server that states nothing about itself is judged by its process alone
    wrong = []
    for key, want in expected.items():
        got = actual.get(key)
        if want is None or got is None:
            continue
        same = (str(got).rstrip("/").rsplit("/", 1)[-1].lower() == str(want).rstrip("/").rsplit("/", 1)[-1].lower()
                if key == "model" else str(got) == str(want))
        if not same:
            wrong.append(key)
    if not wrong:
        return None
    return (f"the server at this address is not the deployment launched ({', '.join(wrong)} differ): expected "
            f"{_text(expected)}; the server says {_text(actual)}")


def _text(ident: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in ident.items() if v is not None) or "nothing"
