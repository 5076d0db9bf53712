"""`capbench serve`: the dashboard, and one runner process, the only writer of the DB, that runs queued campaigns
in turn. The dashboard stays read-only on the DB: a campaign submitted there is a YAML file dropped in the queue
folder (`<db folder>/campaign-queue/`), which the runner checks, enters in the DB as queued (or rejects with its
problems in NAME.rejected.txt), and runs in the order submitted. Anyone may queue from the page or by copying a
file into the folder; `capbench campaign FILE` still runs one directly without the service.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.campaign import record
from bench.campaign.run import Interrupt, run_campaign
from bench.campaign.spec import parse_campaign
from bench.errors import BadInput
from bench.store import Store

POLL_S = 1.0


def queue_dir(db: Path) -> Path:
    return db.resolve().parent / "campaign-queue"


def submit(db: Path, name: str, text: str) -> Path:
    """Drop a campaign file in the queue folder (what the dashboard does; it never writes the DB)."""
    folder = queue_dir(db)
    folder.mkdir(parents=True, exist_ok=True)
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in Path(name).stem) or "campaign"
    path = folder / f"{time.time_ns()}-{stem}.yaml"
    tmp = path.with_suffix(".part")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def pending(db: Path) -> list[Path]:
    folder = queue_dir(db)
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def take_submissions(store: Store, db: Path) -> list[str]:
    """Every file in the queue folder into the DB as a queued campaign (or rejected); returns the new ids."""
    ids = []
    for path in pending(db):
        text = path.read_text()
        try:
            campaign = parse_campaign(text, path.name)
        except BadInput as e:
            path.with_suffix(".rejected.txt").write_text(str(e) + "\n")
            path.unlink()
            continue
        ids.append(record.new_campaign(store, campaign, path.name, status="queued"))
        path.unlink()
    return ids


def run_queue(db: Path, once: bool = False) -> None:
    """The runner: take submissions, run the oldest queued campaign, repeat (`once`: until the queue is empty)."""
    store = Store(db)
    stop = Interrupt()  # Ctrl-C or SIGTERM: the campaign running stops (aborted, resumable), then the runner
    try:
        while not stop.hit:
            take_submissions(store, db)
            nxt = record.next_queued(store)
            if nxt is None:
                if once:
                    return
                time.sleep(POLL_S)
                continue
            cid, text = nxt
            try:
                run_campaign(parse_campaign(text, cid), db, cid=cid)
            except BadInput as e:
                print(f"campaign {cid} failed: {e}", file=sys.stderr, flush=True)
                record.set_status(store, cid, "failed")
    finally:
        stop.close()


def serve_queue(db: Path, host: str, port: int) -> None:
    """The dashboard in a process of its own, this process the runner; Ctrl-C stops both."""
    Store(db)  # create and migrate before the dashboard opens it read-only
    app_py = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    env = {**os.environ, "CAPBENCH_DB": str(db.expanduser().resolve())}
    argv = [sys.executable, "-m", "streamlit", "run", str(app_py), "--server.address", host, "--server.port",
            str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    dash = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    print(f"capbench serve: dashboard on http://{host}:{port}, runner on {env['CAPBENCH_DB']}, queue folder "
          f"{queue_dir(db)}", flush=True)
    try:
        run_queue(db)
    except KeyboardInterrupt:
        pass
    finally:
        dash.terminate()
        try:
            dash.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dash.kill()
