"""Cancellation injection (`capbench run --cancel SHARE[:after=SECONDS]`): a seeded share of the requests is
closed by the client, at its first token or SECONDS after it was sent, as a user who gives up or presses stop. The
connection is closed (the server sees the client go away, as it would a browser's tab close); the request's record
has status `cancelled`: not an error, not in the latency percentiles, counted beside them in the summary.

Which requests: request id r is cancelled when seeded(seed, "cancel", r) draws below SHARE, so a run of the same
seed cancels the same requests whatever the worker processes. A request that ends before its time comes is not
cancelled (a short answer can finish first): the summary counts the requests cancelled, not the ones picked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import gevent

from bench.errors import BadInput
from loadgen.prompts import seeded
from loadgen.responses import RequestFailed, Stream

SPEC = re.compile(r"(?P<share>[0-9.eE+-]+)(?::after=(?P<after>[0-9.eE+-]+)s?)?")


class Cancelled(RequestFailed):
    """The client closed the request on purpose (--cancel): its record is `cancelled`, not an error."""


def parse(text: str | None) -> dict | None:
    """--cancel SHARE[:after=SECONDS] as the run's config keeps it: {share, after_s (None: at the first token)}."""
    if text is None:
        return None
    m = SPEC.fullmatch(text.strip())
    try:
        share = float(m["share"]) if m else -1.0
        after = None if not m or m["after"] is None else float(m["after"])
    except ValueError:
        share, after = -1.0, None
    if not 0 < share <= 1 or (after is not None and not 0 <= after <= 86400):
        raise BadInput(f"--cancel takes SHARE[:after=SECONDS] (0 < SHARE <= 1, 0 <= SECONDS <= 86400), not {text!r}")
    return {"share": share, "after_s": after}


def picked(spec: dict | None, seed: int, request_id: str) -> bool:
    return spec is not None and seeded(seed, "cancel", request_id).random() < float(spec["share"])


@contextmanager
def armed(spec: dict | None, seed: int, request_id: str, stream: Stream) -> Iterator[None]:
    """Around reading a response: for a picked request, raises Cancelled at the first token (wrapping
    stream.on_first) or once `after_s` seconds have passed since it was sent (the response's headers are awaited
    first: cut inside the HTTP client's header read, its connection would not go back to the pool)."""
    if not picked(spec, seed, request_id):
        yield
        return
    after = spec.get("after_s")
    if after is None:
        first = stream.on_first

        def cut(now: float) -> None:
            if first is not None:
                first(now)
            raise Cancelled("cancelled", "closed by the client at the first token (--cancel)")

        stream.on_first = cut
        yield
        return
    left = max(1e-6, float(after) - (time.perf_counter() - stream.start))
    with gevent.Timeout(left, Cancelled("cancelled", f"closed by the client {after:g} s after sending (--cancel)")):
        yield
