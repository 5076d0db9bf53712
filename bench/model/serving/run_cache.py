"""The prefix cache of `capbench simulate`, kept as runs of consecutive block keys instead of one entry a block.

A simulated request's blocks are runs: block i of an owner (a system prompt, a session) is keyed
owner * 2**24 + i (workload._keys), so a 15k-token agentic prompt is two runs where PrefixCache holds 460 keys,
and holding, unlocking and evicting them was half of an agentic simulation. RunCache keeps pieces [start, end) of
keys with one reference count each, and the evictable ones (count 0) in PrefixCache's LRU order: each run a call
puts into the LRU gets the next sequence number, and within it the blocks age the way PrefixCache inserts them
(deepest first on unlock, in order on add_free), so a piece's oldest block is known and a split piece keeps its
age. It does what PrefixCache does block for block (tests/bench/model/test_run_cache.py replays random calls on
both); the twin and validate, whose keys are hashes, keep PrefixCache.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence


class Runs:
    """Block keys as runs [lo, hi) of consecutive ints, in order: a list of keys that slices and adds in O(runs)."""

    __slots__ = ("runs", "n")

    def __init__(self, runs: Sequence[tuple[int, int]] = ()) -> None:
        merged: list[tuple[int, int]] = []
        for lo, hi in runs:
            if hi <= lo:
                continue
            if merged and merged[-1][1] == lo:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        self.runs = tuple(merged)
        self.n = sum(hi - lo for lo, hi in merged)

    @classmethod
    def _of(cls, runs: tuple[tuple[int, int], ...], n: int) -> Runs:
        """Runs already merged, with their length: slicing and adding make them (Runs() merging was 5 % of an
        agentic simulation)."""
        r = object.__new__(cls)
        r.runs, r.n = runs, n
        return r

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.runs:
            yield from range(lo, hi)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Runs) and self.runs == other.runs

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"Runs({list(self.runs)})"

    def __add__(self, other: Runs) -> Runs:
        if not other.n or not self.n:
            return other if self.n == 0 else self
        if self.runs[-1][1] == other.runs[0][0]:
            return Runs._of(self.runs[:-1] + ((self.runs[-1][0], other.runs[0][1]),) + other.runs[1:],
                            self.n + other.n)
        return Runs._of(self.runs + other.runs, self.n + other.n)

    def __getitem__(self, s: slice) -> Runs:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("Runs take plain slices only")
        start, stop, _ = s.indices(self.n)
        if start == 0 and stop == self.n:
            return self
        if stop <= start:
            return _NONE
        out, pos = [], 0
        for lo, hi in self.runs:
            a, b = max(lo, lo + start - pos), min(hi, lo + stop - pos)
            if a < b:
                out.append((a, b))
            pos += hi - lo
            if pos >= stop:
                break
        return Runs._of(tuple(out), stop - start)


_NONE = Runs()


def _runs(keys: Runs | Sequence) -> tuple[tuple[int, int], ...]:
    if isinstance(keys, Runs):
        return keys.runs
    if len(keys):
        raise TypeError("RunCache takes Runs (a request without keys may pass an empty list)")
    return ()


class RunCache:
    """PrefixCache's blocks, refcounts and LRU order, as pieces of consecutive keys."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.version = 0  # bumped on every change, as PrefixCache's
        self._starts: list[int] = []  # sorted starts of the pieces
        self._piece: dict[int, list[int]] = {}  # start -> [end, count, seq, dir]: seq and dir when count is 0
        self._heap: list[tuple[int, int, int]] = []  # (seq, dir x oldest key, start) of count-0 pieces; stale ones
        self._seq = 0  # skipped when popped
        self._cached = 0  # blocks
        self._free = 0  # blocks with count 0

    @property
    def tokens(self) -> int:
        return self._cached * self.block_size

    @property
    def evictable_tokens(self) -> int:
        return self._free * self.block_size

    # ---- what a caller reads
    def match(self, keys: Runs | Sequence) -> int:
        """Leading keys cached."""
        n = 0
        for lo, hi in _runs(keys):
            p = lo
            while p < hi:
                i = bisect_right(self._starts, p) - 1
                end = self._piece[self._starts[i]][0] if i >= 0 else p
                if end <= p:
                    return n + p - lo
                p = min(end, hi)
            n += hi - lo
        return n

    def unheld(self, keys: Runs | Sequence, upto: int | None = None) -> int:
        """How many of these keys (the first `upto`) no request holds (evictable)."""
        n, left = 0, len(keys) if upto is None else upto
        for lo, hi in _runs(keys):
            if left <= 0:
                break
            hi = min(hi, lo + left)
            left -= hi - lo
            for s, piece in self._overlapping(lo, hi):
                if piece[1] == 0:
                    n += min(hi, piece[0]) - max(lo, s)
        return n

    # ---- changes
    def hold(self, keys: Runs | Sequence) -> None:
        """Take a reference on each key, adding the ones not cached yet (PrefixCache.hold)."""
        runs = _runs(keys)
        self.version += bool(runs)  # an unchanged cache keeps its version: the queue head's match stands
        for lo, hi in runs:
            self._split(lo)
            self._split(hi)
            p = lo
            for s, piece in self._overlapping(lo, hi):
                if s > p:
                    self._add(p, s, 1)
                if piece[1] == 0:
                    self._free -= piece[0] - s
                piece[1] += 1
                p = piece[0]
            if p < hi:
                self._add(p, hi, 1)

    def add_free(self, keys: Runs | Sequence) -> None:
        """Add unheld blocks in order; keys already cached are left as they are (PrefixCache.add_free)."""
        runs = _runs(keys)
        self.version += bool(runs)
        for lo, hi in runs:
            self._seq += 1
            p = lo
            for s, piece in self._overlapping(lo, hi):
                if s > p:
                    self._add(p, s, 0, self._seq, 1)
                p = piece[0]
            if p < hi:
                self._add(p, hi, 0, self._seq, 1)

    def unlock(self, keys: Runs | Sequence) -> None:
        """Drop a reference on each key; those no one holds now become evictable, deepest first (PrefixCache.unlock)."""
        runs = _runs(keys)
        self.version += bool(runs)
        for lo, hi in reversed(runs):
            self._seq += 1
            self._split(lo)
            self._split(hi)
            for s, piece in self._overlapping(lo, hi):
                piece[1] -= 1
                if piece[1] == 0:
                    piece[2], piece[3] = self._seq, -1
                    self._free += piece[0] - s
                    heapq.heappush(self._heap, (self._seq, 1 - piece[0], s))

    def evict(self, tokens: int) -> int:
        """Evict the least recently used unheld blocks that cover `tokens`; the tokens freed."""
        n = max(0, min(self._free, math.ceil(tokens / self.block_size)))
        self.version += n > 0
        left = n
        while left:
            seq, oldest, s = heapq.heappop(self._heap)
            piece = self._piece.get(s)
            if piece is None or piece[1] or piece[2] != seq or self._oldest(s, piece) != oldest:
                continue  # stale: the piece was held, split or evicted since
            end, size = piece[0], piece[0] - s
            take = min(left, size)
            left -= take
            self._free -= take
            self._cached -= take
            if take == size:
                self._remove(s)
            elif piece[3] < 0:  # deepest first: its oldest blocks are at the end
                piece[0] = end - take
                heapq.heappush(self._heap, (seq, self._oldest(s, piece), s))
            else:
                self._remove(s)
                self._insert(s + take, [end, 0, seq, 1])
        return n * self.block_size

    def clear(self) -> None:
        self.version += 1
        for s in [s for s in self._starts if self._piece[s][1] == 0]:
            self._cached -= self._piece[s][0] - s
            self._remove(s)
        self._heap, self._free = [], 0

    # ---- PrefixCache's view, for tests
    @property
    def ref(self) -> dict[int, int]:
        return {k: self._piece[s][1] for s in self._starts for k in range(s, self._piece[s][0])}

    @property
    def lru(self) -> list[int]:
        free = sorted((p[2], self._oldest(s, p), s) for s, p in self._piece.items() if p[1] == 0)
        return [k for _, _, s in free for k in (range(self._piece[s][0] - 1, s - 1, -1) if self._piece[s][3] < 0
                                                else range(s, self._piece[s][0]))]

    # ---- pieces
    @staticmethod
    def _oldest(s: int, piece: list[int]) -> int:
        """dir x the piece's oldest key: the heap orders a sequence number's pieces by it."""
        return 1 - piece[0] if piece[3] < 0 else s

    def _overlapping(self, lo: int, hi: int) -> list[tuple[int, list[int]]]:
        """The pieces that overlap [lo, hi), in order (a list: callers may add pieces while they walk it)."""
        starts, pieces = self._starts, self._piece
        i = max(0, bisect_right(starts, lo) - 1)
        return [(s, p) for s in starts[i:bisect_left(starts, hi, i)] if (p := pieces[s])[0] > lo]

    def _split(self, x: int) -> None:
        i = bisect_right(self._starts, x) - 1
        if i < 0:
            return
        s = self._starts[i]
        piece = self._piece[s]
        if not s < x < piece[0]:
            return
        right = [piece[0], piece[1], piece[2], piece[3]]
        piece[0] = x
        self._starts.insert(i + 1, x)
        self._piece[x] = right
        if piece[1] == 0:
            heapq.heappush(self._heap, (piece[2], self._oldest(s, piece), s))
            heapq.heappush(self._heap, (right[2], self._oldest(x, right), x))

    def _add(self, lo: int, hi: int, count: int, seq: int = 0, direction: int = 0) -> None:
        self._insert(lo, [hi, count, seq, direction])
        self._cached += hi - lo
        if count == 0:
            self._free += hi - lo

    def _insert(self, s: int, piece: list[int]) -> None:
        i = bisect_right(self._starts, s)
        self._starts.insert(i, s)
        self._piece[s] = piece
        if piece[1] == 0 and piece[2]:
            heapq.heappush(self._heap, (piece[2], self._oldest(s, piece), s))

    def _remove(self, s: int) -> None:
        del self._piece[s]
        del self._starts[bisect_right(self._starts, s) - 1]
