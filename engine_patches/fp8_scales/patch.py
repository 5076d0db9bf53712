"""Entry points the launcher calls in every SGLang process: `apply(args)` or, in spawned children, `apply_from_env()`.

    --record-kv-amax PATH   calibration run (BF16 KV): dump per-layer K/V maxima to PATH.rank<R>.json
    --kv-scales PATH        serving run (fp8_e4m3 KV): load per-layer scales from PATH (also passed to SGLang as
                            --quantization-param-path, which is what makes SGLang call the loader)

SGLang starts its schedulers with multiprocessing "spawn", so a patch applied in the launcher process does not
reach them. `environ(args)` gives the variables that carry the choice into children, where `apply_from_env()`
re-applies it (the launcher runs that in each child).
"""

from __future__ import annotations

import os

ENV_RECORD = "CAPBENCH_RECORD_KV_AMAX"
ENV_SCALES = "CAPBENCH_KV_SCALES"
ENV_INTERVAL = "CAPBENCH_KV_AMAX_INTERVAL_S"

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
    """`args` is any object with optional attributes `record_kv_amax` and `kv_scales` (argparse namespace)."""
    record = getattr(args, "record_kv_amax", None)
    scales = getattr(args, "kv_scales", None)
    if record and scales:
        raise ValueError("--record-kv-amax (a BF16 calibration run) and --kv-scales (an FP8 run) exclude each other")
    if record:
        apply_recording(record, float(os.environ.get(ENV_INTERVAL, "2.0")))
    if scales:
        apply_loading()


def environ(args) -> dict[str, str]:
    env = {}
    if getattr(args, "record_kv_amax", None):
        env[ENV_RECORD] = os.path.abspath(args.record_kv_amax)
    if getattr(args, "kv_scales", None):
        env[ENV_SCALES] = os.path.abspath(args.kv_scales)
    return env


def sglang_args(args) -> list[str]:
    """Extra SGLang server arguments the choice implies."""
    if getattr(args, "kv_scales", None):
        return ["--quantization-param-path", os.path.abspath(args.kv_scales)]
    return []


def apply_from_env() -> None:
    class _Args:
        record_kv_amax = os.environ.get(ENV_RECORD)
        kv_scales = os.environ.get(ENV_SCALES)

    apply(_Args)


def apply_record(options) -> None:
    """engine_patches/launch.py's hook for --record-kv-amax (runs in each SGLang process)."""
    apply_recording(os.path.abspath(options.record_kv_amax), float(os.environ.get(ENV_INTERVAL, "2.0")))


def apply_load(options) -> None:
    """engine_patches/launch.py's hook for --kv-scales (runs in each SGLang process)."""
    apply_loading()
