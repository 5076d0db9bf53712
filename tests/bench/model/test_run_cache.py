"""RunCache keeps runs of block keys and must do, block for block, what PrefixCache does with one key a block:
the same hits, unheld counts, evictions, refcounts and LRU order, on random calls shaped like a simulation's
(prompts that hold a session's leading blocks, unlocks, outputs added free, evictions) and on arbitrary ones."""

from __future__ import annotations

import random

import pytest

from bench.model.serving.prefix_cache import PrefixCache
from bench.model.serving.run_cache import RunCache, Runs


def _random_runs(rng: random.Random, chain: bool) -> Runs:
    """A prompt's keys: a system prompt's run then a session's (chain), or runs anywhere (not chain)."""
    if chain:
        system = rng.choice([0, 4, 8])
        owner = (2 + rng.randrange(10)) << 24
        end = system + rng.randrange(1, 80)
        return Runs([(1 << 24, (1 << 24) + system), (owner + system, owner + end)])
    runs, lo = [], rng.randrange(200)
    for _ in range(rng.randrange(1, 4)):
        hi = lo + rng.randrange(1, 30)
        runs.append((lo, hi))
        lo = hi + rng.randrange(0, 20)
    return Runs(runs)


def _same(fast: RunCache, slow: PrefixCache) -> None:
    assert fast.ref == dict(slow.ref)
    assert fast.lru == list(slow.lru)  # the eviction order too
    assert (fast.tokens, fast.evictable_tokens) == (slow.tokens, slow.evictable_tokens)


@pytest.mark.parametrize("chain", [True, False], ids=["sessions", "anywhere"])
def test_run_cache_does_block_for_block_what_the_prefix_cache_does(chain):
    rng = random.Random(11)
    fast, slow = RunCache(16), PrefixCache(16)
    held: list[Runs] = []
    most_evictable, split = 0, 0
    for _ in range(4000):
        keys = _random_runs(rng, chain)
        op = rng.random()
        if op < 0.35:
            hit = fast.match(keys)
            assert hit == slow.match(list(keys))
            assert fast.unheld(keys[:hit]) == slow.unheld(list(keys)[:hit]) == fast.unheld(keys, hit)
            assert fast.unheld(keys, hit) == slow.unheld(list(keys), hit)
            fast.hold(keys[:hit])  # admitted: its hit blocks, then (prefill done) the rest, as the scheduler does
            slow.hold(list(keys)[:hit])
            if rng.random() < 0.8:
                fast.hold(keys[hit:])
                slow.hold(list(keys)[hit:])
                held.append(keys)
            else:
                held.append(keys[:hit])
        elif op < 0.65 and held:
            keys = held.pop(rng.randrange(len(held)))
            fast.unlock(keys)
            slow.unlock(list(keys))
        elif op < 0.8:
            fast.add_free(keys)
            slow.add_free(list(keys))
        elif op < 0.99:
            tokens = rng.randrange(-5, 40 * 16)
            assert fast.evict(tokens) == slow.evict(tokens) if tokens >= 0 else fast.evict(tokens) == 0
        else:
            fast.clear()
            slow.clear()
        _same(fast, slow)
        most_evictable = max(most_evictable, len(slow.lru))
        split = max(split, len(fast._starts))
    assert most_evictable > 100 and any(v > 1 for v in slow.ref.values())  # shared and evictable blocks were met
    assert split > 10  # and pieces that were split


def test_runs_slice_and_add_as_the_list_of_their_keys():
    rng = random.Random(3)
    for _ in range(500):
        a, b = _random_runs(rng, False), _random_runs(rng, True)
        keys = list(a)
        i, j = sorted(rng.randrange(-3, len(keys) + 4) for _ in range(2))
        assert list(a[i:j]) == keys[i:j] and list(a[:j]) == keys[:j] and list(a[i:]) == keys[i:]
        assert len(a[i:j]) == len(keys[i:j])
        assert list(a + b) == keys + list(b) and len(a + b) == len(a) + len(b)
    assert Runs([(0, 3), (3, 5)]).runs == ((0, 5),)  # adjacent runs are one


def test_a_run_cache_refuses_keys_that_are_not_runs():
    cache = RunCache(16)
    cache.hold([])  # a request without keys (calibrate's replays)
    assert cache.match([]) == 0
    with pytest.raises(TypeError):
        cache.hold([1, 2, 3])
