"""A campaign in the results DB (migration 5): the campaign (its file, its status in the queue) and one row per
cell (deployment x load: completed or failed, its result, the error and the server's last log lines). The runs of
a cell carry the campaign id and the cell in runs.config."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
import time
from datetime import UTC, datetime

from bench.campaign.spec import Campaign
from bench.store import Store

STATUSES = ("queued", "running", "completed", "failed", "aborted")


def new_campaign(store: Store, campaign: Campaign, source: str, status: str = "running") -> str:
    cid = "c" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    now = time.time()
    with store.connect() as con:
        con.execute("INSERT INTO campaigns VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
                    [cid, campaign.name, campaign.digest, source, campaign.text, status, now,
                     now if status == "running" else None, _user(), os.getpid(), socket.gethostname()])
    return cid


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def resumable(store: Store, campaign: Campaign) -> str | None:
    """The latest campaign of this name and file that did not complete."""
    with store.connect() as con:
        row = con.execute("SELECT campaign_id FROM campaigns WHERE name = ? AND digest = ? AND status <> 'completed' "
                          "ORDER BY submitted_at DESC LIMIT 1", [campaign.name, campaign.digest]).fetchone()
    return row[0] if row else None


def set_status(store: Store, cid: str, status: str) -> None:
    with store.connect() as con:
        if status == "running":
            con.execute("UPDATE campaigns SET status = ?, started_at = coalesce(started_at, ?), pid = ?, hostname = ?"
                        " WHERE campaign_id = ?", [status, time.time(), os.getpid(), socket.gethostname(), cid])
        else:
            con.execute("UPDATE campaigns SET status = ?, finished_at = ? WHERE campaign_id = ?",
                        [status, time.time() if status in ("completed", "failed", "aborted") else None, cid])


def completed_cells(store: Store, cid: str) -> set[str]:
    with store.connect() as con:
        rows = con.execute("SELECT cell FROM campaign_cells WHERE campaign_id = ? AND status = 'completed'",
                           [cid]).fetchall()
    return {r[0] for r in rows}


def start_cell(store: Store, cid: str, cell: str, deployment: str, load: str) -> None:
    """A cell starts again from scratch: an earlier attempt's row goes (its runs stay in the runs table)."""
    with store.connect() as con:
        con.execute("DELETE FROM campaign_cells WHERE campaign_id = ? AND cell = ?", [cid, cell])
        con.execute("INSERT INTO campaign_cells VALUES (?, ?, ?, ?, 'running', ?, NULL, NULL, NULL, NULL)",
                    [cid, cell, deployment, load, time.time()])


def finish_cell(store: Store, cid: str, cell: str, status: str, result: dict | None = None, error: str | None = None,
                log: str | None = None) -> None:
    with store.connect() as con:
        con.execute("UPDATE campaign_cells SET status = ?, finished_at = ?, result = ?, error = ?, log = ? "
                    "WHERE campaign_id = ? AND cell = ?",
                    [status, time.time(), json.dumps(result) if result is not None else None, error, log, cid, cell])


def next_queued(store: Store) -> tuple[str, str] | None:
    """(campaign id, its file's text) of the oldest queued campaign."""
    with store.connect() as con:
        row = con.execute("SELECT campaign_id, spec FROM campaigns WHERE status = 'queued' ORDER BY submitted_at "
                          "LIMIT 1").fetchone()
    return (row[0], row[1]) if row else None
