"""Plugs the checksummed radix cache into SGLang through its own extension point, the radix-cache registry
(`register_radix_cache_backend`, selected with `--radix-cache-backend`)."""

from __future__ import annotations

BACKEND = "capbench_kv_checksum"


def register_backend(mode: str, scrub_pages_per_s: float = 0.0, integrity_log: str | None = None) -> None:
    """Register the backend (idempotent). Runs while sglang is still importing, so the cache class is imported
    only when the scheduler builds its tree cache."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND) is not None:
        return

    def factory(ctx):
        import torch

        from engine_patches.kv_checksum.radix import ChecksummedRadixCache

        runner = getattr(ctx.tp_worker, "model_runner", None)
        stream = getattr(runner, "forward_stream", None)
        return ChecksummedRadixCache(
            ctx.params,
            mode=mode,
            scrub_pages_per_s=scrub_pages_per_s,
            integrity_log=integrity_log,
            seal_stream=stream if isinstance(stream, torch.cuda.Stream) else None,
        )

    register_radix_cache_backend(BACKEND, factory)
