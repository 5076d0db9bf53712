"""Plugs the checksummed tree into SGLang through its own extension points: the radix-cache registry
(`register_radix_cache_backend`, selected with `--radix-cache-backend`) builds SGLang's default unified tree with
`create_unified_radix_cache(ctx, cache_class=...)`, so HiCache, sessions, T-LRU and hybrid components are set up
exactly as without checksums; and the two hooks of hooks.py."""

from __future__ import annotations

BACKEND = "capbench_kv_checksum"


def unified_tree_or_refusal(ctx) -> str | None:
    """Why SGLang's default selection would not build the unified tree for this server, or None when it would."""
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    if ctx.disable_radix_cache:
        return "--disable-radix-cache leaves no cache to check"
    if memory.enable_lmcache:
        return "LMCache's tree is not covered"
    if memory.enable_unified_cache_external_linker:
        return "the unified cache's external linker loads pages past the checks"
    if ctx.is_hybrid_swa and ctx.full_tokens_per_layer == 0:
        return "pure sliding-window models use PureSWARadixCache, which is not covered"
    if memory.enable_flexkv:
        return "FlexKV's tree is not covered"
    return None


def register_backend(
    mode: str, scrub_pages_per_s: float = 0.0, integrity_log: str | None = None, name: str = BACKEND, **tree_options
) -> None:
    """Register the backend under `name` (idempotent). Runs while sglang is still importing, so the tree is
    imported only when the scheduler builds its tree cache."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(name) is not None:
        return

    def factory(ctx):
        from functools import partial

        from sglang.srt.mem_cache.registry import create_unified_radix_cache

        from engine_patches.kv_checksum.tree import ChecksummedUnifiedRadixCache

        refusal = unified_tree_or_refusal(ctx)
        if refusal:
            raise ValueError(f"--kv-checksum: {refusal}")
        tree = partial(ChecksummedUnifiedRadixCache, mode=mode, scrub_pages_per_s=scrub_pages_per_s,
                       integrity_log=integrity_log, **tree_options)
        return create_unified_radix_cache(ctx, cache_class=tree)

    register_radix_cache_backend(name, factory)
