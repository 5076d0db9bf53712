"""The prefix cache the scheduler shares KV through: blocks of `block_size` tokens keyed by a chain of the tokens
before them (the caller makes the keys); a block is held while requests use it, else evictable, least recently used
first (SGLang's radix cache, at block granularity)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable


class PrefixCache:
    """KV blocks by key: refcount > 0 while requests use them, else evictable in LRU order."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.ref: dict[Hashable, int] = {}
        self.lru: OrderedDict[Hashable, None] = OrderedDict()
        self.version = 0  # bumped on every change, so a blocked queue head's match is computed once

    @property
    def tokens(self) -> int:
        return len(self.ref) * self.block_size

    @property
    def evictable_tokens(self) -> int:
        return len(self.lru) * self.block_size

    def match(self, keys: list[Hashable]) -> int:
        ref, n = self.ref, 0
        for key in keys:
            if key not in ref:
                break
            n += 1
        return n

    def hold(self, keys: list[Hashable]) -> None:
        """Take a reference on each key, adding the ones not cached yet."""
        ref, lru = self.ref, self.lru
        self.version += 1
        for key in keys:
            count = ref.get(key, 0)
            if count == 0 and key in lru:
                del lru[key]
            ref[key] = count + 1

    def add_free(self, keys: list[Hashable]) -> None:
        """Add unheld blocks (a finished request's output); keys already cached are left as they are."""
        ref, lru = self.ref, self.lru
        self.version += 1
        for key in keys:
            if key not in ref:
                ref[key] = 0
                lru[key] = None

    def unlock(self, keys: list[Hashable]) -> None:
        ref, lru = self.ref, self.lru
        self.version += 1
        for key in reversed(keys):  # deepest first, so a chain's root is the most recently used
            count = ref[key] - 1
            ref[key] = count
            if count == 0:
                lru[key] = None

    def evict(self, tokens: int) -> int:
        n = min(len(self.lru), math.ceil(tokens / self.block_size))
        ref, pop = self.ref, self.lru.popitem
        self.version += 1
        for _ in range(n):
            del ref[pop(last=False)[0]]
        return n * self.block_size

    def clear(self) -> None:
        self.version += 1
        for key in self.lru:
            del self.ref[key]
        self.lru.clear()
