"""Admission checks batched per scheduler step (engine_patches/kv_checksum/step.py), on SGLang's real pool,
allocator and default tree: a step that admits 1, 32 or 256 requests flags exactly the damaged pages, reads back
once, and agrees across tensor-parallel ranks in one all-reduce of its verdict vector."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
import torch
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.radix_cache import RadixKey

from engine_patches.kv_checksum.step import NO_CUT, pack, unpack
from tests.engine_patches.kv_server import Geometry, Server

ROOT = Path(__file__).resolve().parents[2]
G = Geometry("mha", page_size=16, pages=1024)
PREFIXES, PREFIX_PAGES = 16, 4


def warm_server(seed: int) -> tuple[Server, list[list[int]]]:
    """A server with PREFIXES cached prefixes of PREFIX_PAGES pages each."""
    s = Server(G, max_reqs=300)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30000) for _ in range(PREFIX_PAGES * G.page_size)] for _ in range(PREFIXES)]
    for i, p in enumerate(prefixes):
        s.submit(f"warm{i}", p + [1], [2])
    s.run()
    return s, prefixes


@pytest.fixture
def warm():
    servers = []

    def build(seed: int) -> tuple[Server, list[list[int]]]:
        s, prefixes = warm_server(seed)
        servers.append(s)
        return s, prefixes

    yield build
    for s in reversed(servers):
        s.close()


def cached_pages(s: Server, prefix: list[int]) -> list[int]:
    matched, node, _ = s.tree.tree_core.match_full_device_prefix(RadixKey(array("q", prefix)))
    assert matched == len(prefix)
    return (s.tree.path_device_indices(node)[:matched:G.page_size] // G.page_size).tolist()


def admit_one_step(s: Server, reqs) -> None:
    """The admission matches of one scheduler step (as install_step_batching wraps SGLang's pass)."""
    with s.tree.kv_step(lambda: reqs) as step:
        for req in reqs:
            req.init_next_round_input(s.tree)
    assert step.fallbacks == 0


def mismatches() -> float:
    return REGISTRY.get_sample_value("capbench_kv_checksum_mismatch_total", {"source": "admission"}) or 0.0


@pytest.mark.parametrize("checks", [1, 32, 256])
def test_a_step_flags_exactly_the_damaged_pages_with_one_read_back(warm, checks):
    for seed in range(3):
        s, prefixes = warm(seed)
        rng = random.Random(100 + seed)
        pages = [cached_pages(s, p) for p in prefixes]
        damaged = {(k, j) for k in range(PREFIXES) for j in range(PREFIX_PAGES) if rng.random() < 0.15}
        for k, j in damaged:
            s.flip(pages[k][j], buffer=rng.randrange(2 * G.layers), byte=rng.randrange(64), bit=rng.randrange(8))
        which = [rng.randrange(PREFIXES) for _ in range(checks)]
        reqs = [s.submit(f"r{i}", prefixes[k] + [rng.randrange(1, 30000) for _ in range(3)], [5])
                for i, k in enumerate(which)]
        backs = []
        read_back = s.tree.kv_seals.read_back
        s.tree.kv_seals.read_back = lambda t, backs=backs, read_back=read_back: backs.append(1) or read_back(t)
        before = mismatches()
        admit_one_step(s, reqs)
        assert len(backs) == 1  # one host read-back for the whole step
        for req, k in zip(reqs, which, strict=True):
            first_bad = min((j for kk, j in damaged if kk == k), default=PREFIX_PAGES)
            assert req.prefix_len == first_bad * G.page_size, (req.rid, k, sorted(damaged))
        # each damaged page on a path a request matched is found once, though several requests share it
        reachable = {(k, j) for k, j in damaged if k in which}
        assert mismatches() - before == len(reachable)


def test_ranks_agree_once_per_step_on_the_smallest_cut(warm):
    """Two ranks: the other rank found page 2 of prefix 0 bad while this rank's copy is clean; every request on that
    prefix is cut there on this rank too, after one all-reduce of the step's verdict vector."""
    s, prefixes = warm(7)
    s.tree.tp_world_size = 2
    other_rank_cut = 2 * G.page_size
    calls = []

    def all_reduce(t: torch.Tensor, op) -> None:  # the other rank's vector, reduced as torch.distributed would
        assert op == torch.distributed.ReduceOp.MIN
        calls.append(t.clone())
        other = torch.where(torch.tensor(owners) == 0, pack(other_rank_cut, NO_CUT), t)  # its packed verdict
        t.copy_(torch.minimum(t, other))

    s.tree._all_reduce = all_reduce
    owners = [i % 4 for i in range(32)]
    reqs = [s.submit(f"r{i}", prefixes[k] + [9, 9, i], [5]) for i, k in enumerate(owners)]
    admit_one_step(s, reqs)
    assert len(calls) == 1 and calls[0].numel() == 32  # one collective, the whole step's verdicts
    for req, k in zip(reqs, owners, strict=True):
        assert req.prefix_len == (other_rank_cut if k == 0 else PREFIX_PAGES * G.page_size)


def test_two_gloo_ranks_agree_once_per_step(tmp_path):
    """Two rank processes (gloo): rank 0's copy of page 2 of prefix 0 is damaged, rank 1's is clean. Each rank's
    step makes one read-back and one all-reduce of its 32 verdicts, and both cut prefix 0's requests at page 2."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # the two ranks fork from one process that imported SGLang once
    p = subprocess.run([sys.executable, "-m", "tests.engine_patches.step_rank_worker", str(port),
                        str(tmp_path / "rank{rank}.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for r in ranks:
        assert r["all_reduces"] == [32] and r["read_backs"] == 1
        assert r["prefix_lens"] == [2 * G.page_size if k == 0 else r["full"] for k in r["owners"]]


def test_a_packed_verdict_keeps_the_smallest_cut_or_a_wait_before_every_cut():
    """Cut and load wait travel as one int in the step's MIN all-reduce: ranks see the same pending pages (loads are
    acknowledged in lockstep) and may differ in cuts."""
    agreed = lambda *ranks: unpack(min(pack(c, w) for c, w in ranks))  # noqa: E731
    assert agreed((NO_CUT, NO_CUT), (NO_CUT, NO_CUT)) == (NO_CUT, NO_CUT)
    assert agreed((32, NO_CUT), (NO_CUT, NO_CUT)) == (32, NO_CUT)
    assert agreed((NO_CUT, 48), (16, 48)) == (16, NO_CUT)  # a cut before the pending page: served up to it
    assert agreed((NO_CUT, 16), (48, 16)) == (NO_CUT, 16)  # pending before every cut: wait (the cut comes later)
    assert agreed((16, 16), (16, 16)) == (16, NO_CUT)  # pending at the cut: nothing before the cut waits
