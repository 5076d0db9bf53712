"""Entry points that apply the FP8-scales patches inside an SGLang process.

    --record-kv-amax PATH   calibration run (BF16 KV): dump per-layer K/V maxima to PATH.rank<R>.json
    --kv-scales PATH        serving run (fp8_e4m3 KV): let GLM-4.x / Kimi K2 load per-layer scales; the launcher also
                            passes PATH to SGLang as --quantization-param-path, which is what makes SGLang call them

engine_patches/launch.py reaches every SGLang process (they are spawned) through its boot sitecustomize and calls
`apply_record` when `sglang.srt.mem_cache.memory_pool` is imported and `apply_load` when
`sglang.srt.model_executor.model_runner` is. `apply(args)` does either from any object with the two attributes.
"""

from __future__ import annotations

import os

ENV_INTERVAL = "CAPBENCH_KV_AMAX_INTERVAL_S"  # seconds between amax dumps (default 2)

_applied: set[str] = set()


def apply_recording(path: str, interval_s: float = 2.0) -> None:
    if "record" in _applied:
        return
    from engine_patches.fp8_scales import recorder

    recorder.install(path, interval_s)
    _applied.add("record")


def apply_loading() -> None:
    if "load" in _applied:
        return
    from engine_patches.fp8_scales import loading

    loading.install()
    _applied.add("load")


def apply(args) -> None:
    """`args`: any object with optional attributes `record_kv_amax` and `kv_scales` (e.g. launch.PatchOptions)."""
    record = getattr(args, "record_kv_amax", None)
    scales = getattr(args, "kv_scales", None)
    if record and scales:
        raise ValueError("--record-kv-amax (a BF16 calibration run) and --kv-scales (an FP8 run) exclude each other")
    if record:
        apply_record(args)
    if scales:
        apply_load(args)


def apply_record(options) -> None:
    """engine_patches/launch.py's hook for --record-kv-amax."""
    apply_recording(os.path.abspath(options.record_kv_amax), float(os.environ.get(ENV_INTERVAL, "2.0")))


def apply_load(options) -> None:
    """engine_patches/launch.py's hook for --kv-scales."""
    apply_loading()
