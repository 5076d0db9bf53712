"""What makes a finished INT4 shard trustworthy after a crash: its manifest entry (size and SHA-256 of the file as
written, fsynced), checked again on `--resume`; and the durability of the final directory before its rename.

A host crash can leave a renamed shard whose data never reached the disk (rename is atomic, the data is not
ordered with it unless fsynced) or a shard truncated by hand: without the manifest, `--resume` would trust it and
the run would end with a complete-looking OUT that SGLang cannot load. No torch here.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HASH_CHUNK = 16 * 2**20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal_file(tmp: Path, final: Path) -> dict:
    """fsync a written file, rename it into place, fsync its directory; its manifest entry (read back from disk)."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return {"file_bytes": final.stat().st_size, "sha256": sha256_of(final)}


def write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def shard_problem(path: Path, record: dict) -> str | None:
    """Why a finished shard cannot be trusted, or None when its file is the one its record describes."""
    if "sha256" not in record or "file_bytes" not in record:
        return "its record has no size and hash (an older capbench wrote it)"
    if not path.is_file():
        return "the file is missing"
    size = path.stat().st_size
    if size != record["file_bytes"]:
        return f"{size} bytes on disk, {record['file_bytes']} written"
    if sha256_of(path) != record["sha256"]:
        return "its SHA-256 differs from the one taken when it was written"
    return None
