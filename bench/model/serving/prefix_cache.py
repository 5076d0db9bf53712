"""The prefix cache the scheduler shares KV through: blocks of `block_size` tokens keyed by a chain of the tokens
before them (the caller makes the keys); a block is held while requests use it, else evictable, least recently used
first (SGLang's radix cache, at block granularity)."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable, Iterator
from itertools import compress, filterfalse, islice, repeat, takewhile
from operator import eq, sub


def _consume(it: Iterator) -> None:
    """Run an iterator to its end in C (itertools' consume recipe): a request holds thousands of blocks, and a
    Python loop over them was most of a long-context simulation."""
    deque(it, maxlen=0)


class PrefixCache:
    """KV blocks by key: refcount > 0 while requests use them, else evictable in LRU order."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.ref: Counter[Hashable] = Counter()  # a missing key is never read as 0: callers test `in` first
        self.lru: OrderedDict[Hashable, None] = OrderedDict()
        self.version = 0  # bumped on every change, so a blocked queue head's match is computed once

    @property
    def tokens(self) -> int:
        return len(self.ref) * self.block_size

    @property
    def evictable_tokens(self) -> int:
        return len(self.lru) * self.block_size

    def match(self, keys: list[Hashable]) -> int:
        """Leading keys cached."""
        return len(list(takewhile(self.ref.__contains__, keys)))

    def unheld(self, keys: list[Hashable], upto: int | None = None) -> int:
        """How many of these cached keys (the first `upto`) no request holds (evictable)."""
        return sum(map(self.lru.__contains__, keys[:upto]))

    def hold(self, keys: list[Hashable]) -> None:
        """Take a reference on each key, adding the ones not cached yet. The evictable ones (in the LRU, refcount 0)
        stop being evictable."""
        self.version += 1
        _consume(map(self.lru.pop, keys, repeat(None)))
        self.ref.update(keys)

    def add_free(self, keys: list[Hashable]) -> None:
        """Add unheld blocks (a finished request's output); keys already cached are left as they are."""
        self.version += 1
        new = dict.fromkeys(filterfalse(self.ref.__contains__, keys))
        dict.update(self.ref, dict.fromkeys(new, 0))
        _consume(map(self.lru.__setitem__, new, repeat(None)))

    def unlock(self, keys: list[Hashable]) -> None:
        ref = self.ref
        self.version += 1
        deepest = keys[::-1]  # deepest first, so a chain's root is the most recently used
        counts = list(map(ref.__getitem__, deepest))
        dict.update(ref, zip(deepest, map(sub, counts, repeat(1)), strict=False))  # sets (Counter.update adds)
        # OrderedDict's own __setitem__ in C: its update() from a dict took 1.6x as long (a long agentic plan's
        # requests unlock thousands of blocks each)
        _consume(map(self.lru.__setitem__, compress(deepest, map(eq, counts, repeat(1))), repeat(None)))

    def evict(self, tokens: int) -> int:
        n = min(len(self.lru), math.ceil(tokens / self.block_size))
        self.version += 1
        if n == 1:  # a decode step short of one block: the common case
            dict.__delitem__(self.ref, self.lru.popitem(last=False)[0])
        elif n:  # dict's own delete in C (Counter's is Python: 48M calls of a long agentic plan)
            oldest = list(islice(self.lru, n))
            _consume(map(self.lru.__delitem__, oldest))
            _consume(map(dict.__delitem__, repeat(self.ref), oldest))
        return n * self.block_size

    def clear(self) -> None:
        self.version += 1
        _consume(map(dict.__delitem__, repeat(self.ref), self.lru))
        self.lru.clear()
