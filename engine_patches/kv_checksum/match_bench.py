"""What a match costs the scheduler with KV checksums on, on this machine (CPU): SGLang's default tree against the
checksummed one, both built by SGLang's own selection over the same pools and cached prefixes.

    .venv/bin/python -m engine_patches.kv_checksum.match_bench [--prefixes 32] [--tokens 2048] [--reps 400]

Prints medians per match: queue-ordering matches (the median of 5 alternated rounds of --reps; the scheduler
makes one per waiting request each round; no page is checked) and admission matches (one per admitted request;
its cached pages are checked, here with the CPU torch reference: on a GPU that is one kernel launch and one host
read-back). Outside a GPU server's environment run it as the tests do (this CPU venv's torchvision needs two op
schemas first): .venv/bin/python -c "import tests.conftest, runpy;
runpy.run_module('engine_patches.kv_checksum.match_bench', run_name='__main__')"
"""

from __future__ import annotations

import argparse
import random
import statistics
from array import array

import torch

from engine_patches.kv_checksum.benchmark import median_s


def build(backend: str | None, page_size: int, pages: int, layers: int):
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    from sglang.srt.runtime_context import get_context

    override = get_context().override_server_args(**({"radix_cache_backend": backend} if backend else {}))
    args = override.install()
    size = pages * page_size
    pool = MLATokenToKVPool(size, page_size, torch.float8_e4m3fn, 512, 64, layers, "cpu", False)
    allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.float8_e4m3fn, "cpu", pool, need_sort=False)
    params = CacheInitParams(disable=False, req_to_token_pool=ReqToTokenPool(4, size, "cpu", False),
                             token_to_kv_pool_allocator=allocator, page_size=page_size)
    ctx = TreeCacheBuildContext(server_args=args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
                                enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=None,
                                model_config=None, tp_size=1, tp_rank=0, tp_group=None)
    try:
        return create_tree_cache(ctx), allocator
    finally:
        override.restore()


def median_us(fn, reps: int) -> float:
    return median_s(fn, reps) * 1e6


def time_matches(tree, keys, reps: int, admit=None) -> float:
    """Median microseconds of one match, cycling over the cached prefixes; `admit` marks admission matches."""
    from contextlib import nullcontext

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    n = iter(range(1 << 30))

    def match():
        with tree.kv_admission(admit) if admit is not None else nullcontext():
            tree.match_prefix(MatchPrefixParams(key=keys[next(n) % len(keys)], req=admit))

    return median_us(match, reps)


def main(argv=None) -> None:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.sampling.sampling_params import SamplingParams

    from engine_patches.kv_checksum.patch import register_backend

    p = argparse.ArgumentParser()
    p.add_argument("--prefixes", type=int, default=32)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per cached prefix")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=4, help="MLA layers (Kimi K2 has 61; the check scales with them)")
    p.add_argument("--reps", type=int, default=400)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    register_backend("verify", name="capbench_kv_checksum_bench")
    rng = random.Random(0)
    prefixes = [array("q", [rng.randrange(1, 50_000) for _ in range(args.tokens)]) for _ in range(args.prefixes)]
    pages = args.prefixes * args.tokens // args.page_size + 8
    keys = [RadixKey(ids + array("q", [7])) for ids in prefixes]
    trees = {}
    with get_parallel().override(tp_rank=0):
        for name, backend in (("SGLang's tree", None), ("checksummed", "capbench_kv_checksum_bench")):
            tree, allocator = build(backend, args.page_size, pages, args.layers)
            for ids in prefixes:
                tree.insert(InsertParams(key=RadixKey(ids), value=allocator.alloc(len(ids))))
            if backend:
                tree.kv_seals.seal(torch.arange(1, pages))
            trees[name] = tree
        # Alternate the two trees over rounds so that neither gets the warm-up or a quiet spell alone.
        rounds = {name: [] for name in trees}
        for _ in range(5):
            for name, tree in trees.items():
                rounds[name].append(time_matches(tree, keys, args.reps))
        rows = {name: {"ordering": statistics.median(r)} for name, r in rounds.items()}
        req = Req("bench", "", keys[0].token_ids, SamplingParams())
        rows["checksummed"]["admission"] = time_matches(trees["checksummed"], keys, max(5, args.reps // 20), admit=req)
    print(f"{args.prefixes} cached prefixes of {args.tokens} tokens, page {args.page_size}, MLA fp8 x {args.layers} "
          f"layers, 1 torch thread")
    base = rows["SGLang's tree"]["ordering"]
    for name, r in rows.items():
        extra = f", admission {r['admission']:.0f} us (checks {args.tokens // args.page_size} pages)" \
            if "admission" in r else ""
        print(f"  {name:14s} ordering match {r['ordering']:.1f} us ({r['ordering'] / base:.2f}x){extra}")


if __name__ == "__main__":
    main()
