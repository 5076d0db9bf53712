"""Where a suite's problems come from: an installed package's data file, named with the package's version and the
file's SHA-256 (both stored with every result), and the seeded choice of problems when a run takes fewer."""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.errors import BadInput


@dataclass(frozen=True)
class Source:
    suite: str
    package: str  # the distribution that ships the data
    path: Path | str  # its data file (or the first of several)

    def info(self) -> dict:
        return {"package": self.package, "version": version(self.package), "file": Path(self.path).name,
                "sha256": sha256(str(self.path))}


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        raise BadInput(f"the {package} package is not installed (pip install {package}); its data is the suite's")\
            from None


@functools.cache
def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def pick(items: list[dict], key: str, limit: int | None, seed: int) -> list[dict]:
    """All problems in the data's order, or `limit` of them drawn with `seed` (then in the data's order)."""
    if limit is None or limit >= len(items):
        return items
    chosen = set(random.Random(seed).sample(range(len(items)), limit))
    return [x for i, x in enumerate(items) if i in chosen]
