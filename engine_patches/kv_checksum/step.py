"""Admission checks batched per scheduler step: one checksum pass, one host read-back and one tensor-parallel
all-reduce for every request a step may admit, instead of one of each per admitted request.

At the first admission match of a step (the scheduler's `_get_new_batch_prefill_raw`, wrapped in hooks.py), the
device paths of the next waiting requests (queue order, at most as many as the step can admit) are walked
read-only. Their pages are gathered once each (requests that share a prefix share its nodes: a node's pages are
taken once), checked together by `PageSeals.check` (one kernel launch and one read-back on a GPU), and each
request's verdict, the token position of the first bad page on its path, is agreed across ranks in one MIN
all-reduce of the vector of verdicts. Every rank walks the same queue over the same tree, so the vectors line up.

The admission match of each of those requests then uses its agreed verdict: no check, no read-back, no
collective. A verdict holds for the positions it covered: nothing is inserted while a step admits, a split keeps
each page at its position, an eviction only shortens a path, and pages loaded back meanwhile are pending (never
compared). A request whose path grew past what was checked, or that was not among the candidates, is checked on
its own as before (counted in `fallbacks`). Pending pages (a HiCache load not yet acknowledged) are not compared:
a request whose path reaches one before its cut waits (its verdict says where), packed into the same all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from sglang.srt.mem_cache.radix_cache import RadixKey

NO_CUT = 1 << 62


class StepChecks:
    def __init__(self, tree, candidates: Callable[[], list], limit: int):
        self.tree, self._candidates, self.limit = tree, candidates, limit
        self.verdicts: dict[int, tuple[int, int, int]] | None = None  # id(req) -> (checked, cut, first pending)
        self.fallbacks = 0

    def verdict(self, req, matched: int) -> tuple[int, int] | None:
        """The agreed cut for `req`'s admission match of `matched` device tokens and the position of its first page
        still being loaded (NO_CUT: none), or None: check it alone."""
        if self.verdicts is None:
            self.verdicts = self._prefetch(req)
        checked = self.verdicts.get(id(req))
        if checked is None or matched > checked[0]:
            self.fallbacks += 1
            return None
        return checked[1], checked[2]

    def _prefetch(self, first) -> dict[int, tuple[int, int, int]]:
        queue = list(self._candidates())
        reqs = [first] + [r for r in queue if r is not first][: max(0, self.limit - 1)]
        tree = self.tree
        seals, P = tree.kv_seals, tree.page_size
        covered: dict[int, int] = {}  # node id -> path position its pages are gathered up to
        entries, segments = [], []  # (req, matched, node ids, end), (start position, node spans, pages)
        with seals.side():  # see PageSeals.side
            for req in reqs:
                key = RadixKey(req.origin_input_ids + req.output_ids, req.extra_key, cache_salt=req.cache_salt)
                matched, node_id, _ = tree.tree_core.match_full_device_prefix(key)  # read-only walk
                path = [n for n in tree.tree_core.collect_path_info([node_id])[0] if n.path_start < matched] \
                    if matched else []
                end = min([matched] + [n.path_start for n in path if n.node_id in tree.kv_bad_nodes])
                start = end
                for n in path:
                    done = covered.get(n.node_id, n.path_start)
                    if done < min(n.path_end, end):
                        start = done
                        break
                if end > start:
                    slots = tree.path_device_indices(node_id)[start:end]
                    spans = [(n.node_id, n.path_start, n.path_end) for n in path]
                    segments.append((start, spans, seals.pages_of(slots)))
                for n in path:
                    if end > n.path_start:
                        covered[n.node_id] = max(covered.get(n.node_id, n.path_start), min(n.path_end, end))
                entries.append((req, matched, {n.node_id for n in path}, end))
            bad: list[tuple[int, int]] = []  # (node id, position) of each bad page
            pending: list[tuple[int, int]] = []  # (node id, position) of each page still being loaded
            if segments:
                check = tree._check(torch.cat([s[2] for s in segments]), source="admission")
                offsets, at = [], 0
                for _start, _, pages in segments:
                    offsets.append(at)
                    at += len(pages)
                for rows, out in ((check.bad_rows, bad), (check.pending_rows, pending)):
                    for row in rows:
                        i = max(k for k, o in enumerate(offsets) if o <= row)
                        start, spans, _ = segments[i]
                        pos = start + (row - offsets[i]) * P
                        out.append((next(nid for nid, s, e in spans if s <= pos < e), pos))
        cuts = [min([end] + [pos for nid, pos in bad if nid in nodes and pos < end]) for _, _, nodes, end in entries]
        cuts = [NO_CUT if c >= matched else c for c, (_, matched, _, _) in zip(cuts, entries, strict=True)]
        waits = [min([NO_CUT] + [pos for nid, pos in pending if nid in nodes and pos < end])
                 for _, _, nodes, end in entries]
        agreed = tree._agree_all([pack(c, w) for c, w in zip(cuts, waits, strict=True)])
        return {id(req): (matched, *unpack(v)) for (req, matched, _, _), v in zip(entries, agreed, strict=True)}


PACKED_NONE = (1 << 63) - 1


def pack(cut: int, wait: int) -> int:
    """A request's verdict as one int for the MIN all-reduce: the earlier of its cut and its first pending page,
    and which one it is. Pending pages are the same on every rank (loads are acknowledged in lockstep), cuts may
    differ: the MIN is the smallest cut, or a wait where a pending page comes before every rank's cut. A waiting
    request is not admitted this step; a bad page behind its wait stays marked and cuts it at a later step."""
    at = min(cut, wait)
    return PACKED_NONE if at >= NO_CUT else 2 * at + (wait < cut)


def unpack(value: int) -> tuple[int, int]:
    """(cut, first pending page) of a packed verdict; NO_CUT where there is none."""
    if value == PACKED_NONE:
        return NO_CUT, NO_CUT
    return (NO_CUT, value >> 1) if value & 1 else (value >> 1, NO_CUT)
