"""`capbench serve`: the dashboard and one runner process, the only writer of the DB, that runs queued campaigns
in turn, supervised as one unit. The dashboard stays read-only on the DB: a campaign submitted there is a YAML file
dropped in the queue folder (`<db folder>/campaign-queue/`), which the runner checks, enters in the DB as queued (or
moves to `rejected/` beside a NAME.reason.txt), and runs in the order submitted.

Anyone who can open the page or write the folder may queue, so a queued campaign launches only what the operator
allowed at start: twins, URLs, and SGLang through the operator's templates (`--templates FILE`) named by the
campaign; a campaign carrying its own shell command is refused (bench/campaign/templates.py).

If the dashboard or the runner exits, the other is stopped and `serve` says why (exit 1); both die with `serve`
even when it is killed outright. A campaign the service was running when it stopped goes back to the queue and
resumes (its completed cells skipped) on the next start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.campaign import guard, record
from bench.campaign.predict import check_campaign
from bench.campaign.run import Interrupt, run_campaign
from bench.campaign.spec import parse_campaign
from bench.campaign.templates import operator_templates
from bench.errors import BadInput
from bench.store import Store, pid_alive

POLL_S = 1.0
# the runner process: gevent patched first (Locust needs it, and Ctrl-C/SIGTERM are acted on between waits)
RUNNER = "from gevent import monkey; monkey.patch_all(); from bench.campaign.queue import runner_main; runner_main()"
NAME_MAX = 60  # characters of a submitted file's name kept in the queue folder


def queue_dir(db: Path) -> Path:
    return db.resolve().parent / "campaign-queue"


def submit(db: Path, name: str, text: str) -> Path:
    """Drop a campaign file in the queue folder (what the dashboard does; it never writes the DB)."""
    folder = queue_dir(db)
    folder.mkdir(parents=True, exist_ok=True)
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in Path(name).stem)[:NAME_MAX] or "campaign"
    path = folder / f"{time.time_ns()}-{stem}.yaml"
    tmp = path.with_suffix(".part")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def pending(db: Path) -> list[Path]:
    folder = queue_dir(db)
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def reject(path: Path, why: str) -> Path:
    """The file moved to rejected/, its reason beside it (NAME.reason.txt); the queue goes on."""
    folder = path.parent / "rejected"
    folder.mkdir(exist_ok=True)
    moved = folder / path.name
    path.replace(moved)
    moved.with_name(moved.name + ".reason.txt").write_text(why.rstrip() + "\n")
    return moved




def take_submissions(store: Store, db: Path, templates: dict | None = None) -> list[str]:
    """Every file in the queue folder into the DB as a queued campaign, or into rejected/ with its reason (what is
    not a regular file, a FIFO or a link, is moved there unread); returns the new ids. A file taken away meanwhile
    is skipped."""
    ids = []
    for path in pending(db):
        try:  # a regular file of at most guard.MAX_BYTES (a FIFO or a link to /dev/zero is refused unread), then
            campaign = check_campaign(guard.read_file(path), path.name, templates)  # what --check says
        except BadInput as e:
            if os.path.lexists(path):  # else withdrawn while being read: nothing to reject
                _reject(path, str(e).replace(str(path), path.name))
            continue
        except Exception as e:  # whatever else is wrong with one file, the runner goes on with the next
            _reject(path, f"{path.name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        ids.append(record.new_campaign(store, campaign, path.name, status="queued"))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return ids



def _reject(path: Path, why: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # taken away meanwhile: nothing to move
        reject(path, why)


def requeue_orphans(store: Store) -> list[str]:
    """Campaigns marked running by a process of this host that is gone (a runner killed outright): queued again."""
    host = socket.gethostname()
    with store.connect() as con:
        rows = con.execute("SELECT campaign_id, pid FROM campaigns WHERE status = 'running' AND hostname = ?",
                           [host]).fetchall()
    out = [cid for cid, pid in rows if not pid_alive(pid)]
    for cid in out:
        record.set_status(store, cid, "queued")
    return out


def run_queue(db: Path, once: bool = False, templates: dict | None = None) -> None:
    """The runner: take submissions, run the oldest queued campaign, repeat (`once`: until the queue is empty).
    Stopped (Ctrl-C, SIGTERM), the campaign running goes back to the queue, to resume on the next start."""
    store = Store(db)
    for cid in requeue_orphans(store):
        print(f"campaign {cid}: its runner is gone; queued again, to resume", file=sys.stderr, flush=True)
    stop = Interrupt()
    try:
        while not stop.hit:
            take_submissions(store, db, templates)
            nxt = record.next_queued(store)
            if nxt is None:
                if once:
                    return
                time.sleep(POLL_S)
                continue
            cid, text = nxt
            try:
                run_campaign(parse_campaign(text, cid, templates), db, cid=cid)
            except KeyboardInterrupt:
                record.set_status(store, cid, "queued")
                print(f"campaign {cid}: stopped with the service; it resumes on the next start", file=sys.stderr,
                      flush=True)
                return
            except Exception as e:  # one campaign's failure is its own, not the service's
                print(f"campaign {cid} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                      file=sys.stderr, flush=True)
                record.set_status(store, cid, "failed")
    finally:
        stop.close()


def runner_main() -> None:
    """The runner process of `capbench serve` (argv: DB [TEMPLATES])."""
    db, templates = Path(sys.argv[1]), operator_templates(sys.argv[2] if len(sys.argv) > 2 else None)
    with contextlib.suppress(KeyboardInterrupt):
        run_queue(db, templates=templates)


def port_taken(host: str, port: int) -> bool:
    """Whether a server listens on host:port. SO_REUSEADDR, as the dashboard's own server binds: a port whose last
    server stopped moments ago (connections in TIME_WAIT) is free, so a supervisor's restart is not refused."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child: SIGTERM when `serve` dies, even by SIGKILL (Linux), so nothing is left on the port."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def serve_queue(db: Path, host: str, port: int, templates_file: str | None = None) -> int:
    """The dashboard and the runner, each a process, supervised: the first to exit stops the other. Returns the
    exit code: 0 on Ctrl-C/SIGTERM, 1 if either died."""
    templates = operator_templates(templates_file)  # a bad file: one line, exit 2, before anything starts
    if port_taken(host, port):
        raise BadInput(f"--port {port}: {host}:{port} is already in use (another dashboard?); nothing was started")
    Store(db)  # create and migrate before the dashboard opens it read-only
    queue_dir(db).mkdir(parents=True, exist_ok=True)  # the folder the operator is told to copy campaign files into
    app_py = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    env = {**os.environ, "CAPBENCH_DB": str(db.expanduser().resolve())}
    if templates_file:
        env["CAPBENCH_TEMPLATES"] = str(Path(templates_file).resolve())
    dash = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(app_py), "--server.address", host,
                             "--server.port", str(port), "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], env=env, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)
    runner = subprocess.Popen([sys.executable, "-c", RUNNER,
                               env["CAPBENCH_DB"], *([env["CAPBENCH_TEMPLATES"]] if templates_file else [])],
                              env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    print(f"capbench serve: dashboard on http://{host}:{port}, runner on {env['CAPBENCH_DB']}, queue folder "
          f"{queue_dir(db)}, launch templates: {', '.join(templates) or 'none (twins and URLs only)'}", flush=True)
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    code, why = 0, ""
    while not stopping:
        if dash.poll() is not None:
            code, why = 1, f"the dashboard exited (code {dash.returncode})"
            break
        if runner.poll() is not None:
            code, why = 1, f"the runner exited (code {runner.returncode})"
            break
        time.sleep(0.3)
    if why:
        print(f"capbench serve: {why}; stopping the service", file=sys.stderr, flush=True)
    for proc in (runner, dash):  # the runner first: its campaign goes back to the queue
        _stop(proc)
    return code


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
