"""Integrity events as JSON lines: one object a line, appended; the store imports them later."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class IntegrityLog:
    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None

    def write(self, kind: str, layer: int | None, page: int | None, detail: dict) -> None:
        if self.path is None:
            return
        record = {"ts": time.time(), "pid": os.getpid(), "kind": kind, "layer": layer, "page": page, "detail": detail}
        # One write() of one line with O_APPEND: lines from several scheduler processes do not interleave.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def read_events(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
