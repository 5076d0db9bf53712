"""`capbench sglang-launch`: start SGLang with capbench's patches applied in every one of its processes.

How the patches reach every process: SGLang starts its schedulers and detokenizer with multiprocessing's
*spawn* method, i.e. fresh interpreters that inherit only the environment. The launcher therefore puts
engine_patches/boot/ first on PYTHONPATH, where a `sitecustomize.py` runs at the start of every Python process,
and passes the options in the CAPBENCH_PATCHES environment variable (JSON). sitecustomize installs import hooks
only: nothing is imported until SGLang itself imports the module a patch attaches to, so unrelated Python
processes pay nothing. A sitecustomize that ours shadows (Debian ships one) is still run.

This module imports neither torch nor sglang: the CLI reaches it lazily, and sitecustomize imports it in every
process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_patches.secrets import FILL_SECRETS, secret_refs

ENV = "CAPBENCH_PATCHES"
BOOT_DIR = Path(__file__).resolve().parent / "boot"
REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKSUM_MODES = ("off", "verify", "strict")


@dataclass
class PatchOptions:
    kv_checksum: str = "off"
    kv_scrub_pages_per_s: float = 0.0
    integrity_log: str | None = None
    kv_scales: str | None = None  # FP8 KV scales file (engine_patches/fp8_scales)
    record_kv_amax: str | None = None  # calibration run: dump per-layer K/V maxima to PATH.rank<R>.json


@dataclass(frozen=True)
class Patch:
    """One capbench patch: when it is on, the server flags it adds, and the SGLang module whose import
    triggers `apply(options)` (a "module:function" path) inside each process."""

    name: str
    enabled: object  # (PatchOptions) -> bool
    server_args: object  # (PatchOptions) -> list[str]
    trigger_module: str
    apply: str


def _kv_checksum_args(o: PatchOptions) -> list[str]:
    from engine_patches.kv_checksum.patch import BACKEND

    return ["--radix-cache-backend", BACKEND]


# The set of patches: add one entry per patch (FP8 KV scales will go here).
PATCHES: list[Patch] = [
    Patch(
        name="kv_checksum",
        enabled=lambda o: o.kv_checksum != "off",
        server_args=_kv_checksum_args,
        trigger_module="sglang.srt.mem_cache.registry",
        apply="engine_patches.launch:_apply_kv_checksum",
    ),
    Patch(
        name="fp8_kv_scales",
        enabled=lambda o: bool(o.kv_scales),
        server_args=lambda o: ["--quantization-param-path", str(Path(o.kv_scales).expanduser().resolve())],
        trigger_module="sglang.srt.model_executor.model_runner",
        apply="engine_patches.fp8_scales.patch:apply_load",
    ),
    Patch(
        name="kv_amax_recorder",
        enabled=lambda o: bool(o.record_kv_amax),
        server_args=lambda o: [],
        trigger_module="sglang.srt.mem_cache.memory_pool",
        apply="engine_patches.fp8_scales.patch:apply_record",
    ),
]


def _apply_kv_checksum(o: PatchOptions) -> None:
    from engine_patches.kv_checksum import hooks
    from engine_patches.kv_checksum.patch import register_backend

    register_backend(o.kv_checksum, o.kv_scrub_pages_per_s, o.integrity_log)
    after_import("sglang.srt.model_executor.model_runner", hooks.install_seal_on_fill)
    after_import("sglang.srt.managers.schedule_batch", hooks.install_admission_mark)
    after_import("sglang.srt.managers.scheduler", hooks.install_step_batching)
    after_import("sglang.srt.managers.schedule_policy", hooks.install_load_wait)
    after_import("sglang.srt.disaggregation.decode", hooks.install_seal_on_arrival)


class BadLaunch(ValueError):
    """Bad launcher input: the CLI turns it into one line and exit code 2."""


def validate(o: PatchOptions, sglang_args: list[str]) -> None:
    sglang_args = server_arguments(sglang_args)
    _validate_int4_checkpoint(sglang_args)
    if o.kv_checksum not in CHECKSUM_MODES:
        raise BadLaunch(f"--kv-checksum must be one of {', '.join(CHECKSUM_MODES)}, got {o.kv_checksum!r}")
    if o.kv_scrub_pages_per_s < 0:
        raise BadLaunch("--kv-scrub-pages-per-s must be >= 0")
    if o.kv_scrub_pages_per_s and o.kv_checksum == "off":
        raise BadLaunch("--kv-scrub-pages-per-s needs --kv-checksum verify or strict")
    if o.kv_checksum != "off":
        _validate_kv_checksum(sglang_args)
    _validate_fp8_scales(o, sglang_args)
    if o.integrity_log:
        parent = Path(o.integrity_log).expanduser().resolve().parent
        if not parent.is_dir():
            raise BadLaunch(f"--integrity-log directory does not exist: {parent}")


# SGLang options whose KV paths the checksums do not follow: one line each, and the launch is refused.
KV_CHECKSUM_CONFLICTS = {
    "--radix-cache-backend": "--kv-checksum selects its own --radix-cache-backend; drop yours",
    "--disable-radix-cache": "--kv-checksum checks pages reused from the radix cache; drop --disable-radix-cache",
    "--hicache-storage-backend": "--kv-checksum does not travel to HiCache storage backends; drop "
                                 "--hicache-storage-backend (host-memory HiCache is covered)",
    "--speculative-algorithm": "--kv-checksum cannot run with --speculative-algorithm: draft tokens rewrite "
                               "pages after they fill",
    "--enable-lmcache": "--kv-checksum covers SGLang's unified radix tree, not LMCache's; drop --enable-lmcache",
    "--enable-flexkv": "--kv-checksum covers SGLang's unified radix tree, not FlexKV's; drop --enable-flexkv",
    "--enable-unified-cache-external-linker": "--kv-checksum does not check pages the external linker loads; "
                                              "drop --enable-unified-cache-external-linker",
}


SCALED_KV_DTYPES = ("nvfp4", "fp4_mx_block16", "mxfp8")  # pools with per-block scale buffers


def _has_flag(sglang_args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in sglang_args)


def _validate_kv_checksum(sglang_args: list[str]) -> None:
    for flag, message in KV_CHECKSUM_CONFLICTS.items():
        if _has_flag(sglang_args, flag):
            raise BadLaunch(message)
    hicache = _has_flag(sglang_args, "--enable-hierarchical-cache") or _has_flag(sglang_args, "--enable-hicache")
    if hicache and os.environ.get("SGLANG_USE_HND_KVCACHE", "").lower() in ("1", "true", "yes"):
        raise BadLaunch("--kv-checksum follows pages to HiCache host memory for NHD pools only; unset "
                        "SGLANG_USE_HND_KVCACHE or drop --enable-hierarchical-cache")
    if hicache and _server_arg(sglang_args, "--kv-cache-dtype", "auto") in SCALED_KV_DTYPES:
        raise BadLaunch("--kv-checksum cannot follow KV scale buffers to HiCache host memory; drop "
                        "--enable-hierarchical-cache or use another --kv-cache-dtype")


def _server_arg(sglang_args: list[str], flag: str, default: str) -> str:
    """The value of `--flag V` or `--flag=V` among SGLang's arguments."""
    for i, a in enumerate(sglang_args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(sglang_args):
            return sglang_args[i + 1]
    return default


def _validate_fp8_scales(o: PatchOptions, sglang_args: list[str]) -> None:
    kv_dtype = _server_arg(sglang_args, "--kv-cache-dtype", "auto")
    if o.kv_scales and o.record_kv_amax:
        raise BadLaunch("--record-kv-amax (a BF16-KV calibration run) and --kv-scales (an FP8 run) exclude each other")
    if o.kv_scales:
        if not Path(o.kv_scales).expanduser().is_file():
            raise BadLaunch(f"--kv-scales file not found: {o.kv_scales}")
        if kv_dtype != "fp8_e4m3":
            raise BadLaunch("--kv-scales needs --kv-cache-dtype fp8_e4m3 (SGLang loads KV scales for e4m3 only)")
        if any(a.split("=", 1)[0] == "--quantization-param-path" for a in sglang_args):
            raise BadLaunch("--kv-scales passes its own --quantization-param-path; drop yours")
    if o.record_kv_amax:
        if kv_dtype.startswith("fp8"):
            raise BadLaunch("--record-kv-amax calibrates on a BF16 KV cache; drop --kv-cache-dtype " + kv_dtype)
        if not Path(o.record_kv_amax).expanduser().resolve().parent.is_dir():
            raise BadLaunch(f"--record-kv-amax directory does not exist: {Path(o.record_kv_amax).parent}")


def active_patches(o: PatchOptions) -> list[Patch]:
    return [p for p in PATCHES if p.enabled(o)]


def describe(o: PatchOptions) -> list[str]:
    lines = []
    for p in PATCHES:
        if p.name == "kv_checksum":
            scrub = f", scrub {o.kv_scrub_pages_per_s:g} pages/s" if o.kv_scrub_pages_per_s else ""
            state = o.kv_checksum + scrub
        else:
            state = "on" if p.enabled(o) else "off"
        lines.append(f"{p.name}: {state}")
    if o.integrity_log:
        lines.append(f"integrity log: {o.integrity_log}")
    if o.kv_scales:
        lines.append(f"FP8 KV scales: {o.kv_scales}")
    if o.record_kv_amax:
        lines.append(f"K/V maxima: {o.record_kv_amax}.rank<R>.json (decode tokens only with --disable-cuda-graph)")
    return lines


def build_command(o: PatchOptions, sglang_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start SGLang with the patches."""
    if o.integrity_log:
        o = PatchOptions(**{**asdict(o), "integrity_log": str(Path(o.integrity_log).expanduser().resolve())})
    sglang_args = server_arguments(sglang_args)
    main = ["-c", FILL_SECRETS] if secret_refs(sglang_args) else ["-m", "sglang.launch_server"]
    argv = [sys.executable, *main, *sglang_args, *int4_checkpoint_args(sglang_args)]
    for p in active_patches(o):
        argv += p.server_args(o)
    env = dict(os.environ)
    path = [str(BOOT_DIR), str(REPO_ROOT)] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV] = json.dumps(asdict(o))
    return argv, env


def launch(o: PatchOptions, sglang_args: list[str], dry_run: bool = False) -> None:
    validate(o, sglang_args)
    missing = [name for name in secret_refs(server_arguments(sglang_args)) if not os.environ.get(name)]
    if missing:
        raise BadLaunch(f"environment variable {missing[0]} (named by env:{missing[0]}) is not set")
    argv, env = build_command(o, sglang_args)
    print("capbench patches for SGLang:")
    for line in describe(o) + describe_int4_checkpoint(server_arguments(sglang_args)):
        print(f"  {line}")
    shown = argv if argv[1] != "-c" else [argv[0], "-m", "sglang.launch_server", *argv[3:]]
    print("exec: " + " ".join(shown), flush=True)
    if dry_run:
        print(f"{ENV}={env[ENV]}")
        print(f"PYTHONPATH={env['PYTHONPATH']}")
        return
    os.execvpe(argv[0], argv, env)


# ---- what follows `--`: SGLang's own arguments, and what an INT4 checkpoint needs ----

LAUNCH_MODULE = ("-m", "sglang.launch_server")


def server_arguments(sglang_args: list[str]) -> list[str]:
    """The arguments for sglang.launch_server, whether given bare (`-- --model-path M`) or as the whole command
    (`-- python -m sglang.launch_server --model-path M`, as SGLang's docs write it)."""
    args = list(sglang_args)
    if args and Path(args[0]).name.startswith("python") and tuple(args[1:3]) == LAUNCH_MODULE:
        return args[3:]
    if tuple(args[:2]) == LAUNCH_MODULE:
        return args[2:]
    return args


def _server_int(sglang_args: list[str], flags: tuple[str, ...], default: int) -> int:
    for flag in flags:
        value = _server_arg(sglang_args, flag, "")
        if value:
            try:
                return int(value)
            except ValueError:
                raise BadLaunch(f"{flag} takes a whole number, got {value!r}") from None
    return default


def _int4_checkpoint(sglang_args: list[str]):
    from engine_patches.int4_moe.layout import read_int4_checkpoint

    path = _server_arg(sglang_args, "--model-path", "") or _server_arg(sglang_args, "--model", "")
    return read_int4_checkpoint(path) if path else None


def _validate_int4_checkpoint(sglang_args: list[str]) -> None:
    """A local INT4 W4A16 checkpoint: every rank must hold whole groups (layout.check_group_size)."""
    from engine_patches.int4_moe.layout import FUSION_OFF, UNFUSED_SHARED_EXPERT_ARCHS, check_group_size

    ckpt = _int4_checkpoint(sglang_args)
    if ckpt is None:
        return
    tp = _server_int(sglang_args, ("--tp", "--tp-size", "--tensor-parallel-size"), 1)
    ep = _server_int(sglang_args, ("--ep", "--ep-size", "--expert-parallel-size"), 1)
    if ckpt.moe_intermediate_size and ckpt.hidden_size:
        from engine_patches.int4_moe.schemes import check_rows, scheme

        try:
            if ckpt.fmt == "int4":
                check_group_size(ckpt.group_size, ckpt.moe_intermediate_size, ckpt.hidden_size, tp, ep)
            else:
                check_rows(scheme(ckpt.fmt), ckpt.moe_intermediate_size, tp, ep)
        except ValueError as e:
            raise BadLaunch(str(e)) from None
    if ckpt.architecture in UNFUSED_SHARED_EXPERT_ARCHS and "--enforce-shared-experts-fusion" in sglang_args:
        what = "INT4" if ckpt.fmt == "int4" else ckpt.fmt
        raise BadLaunch(f"{ckpt.architecture} with {what} experts keeps its shared expert in BF16, which SGLang's "
                        "fused quantised slot cannot load: drop --enforce-shared-experts-fusion "
                        f"(the launcher adds {FUSION_OFF})")


def int4_checkpoint_args(sglang_args: list[str]) -> list[str]:
    """Server flags a local INT4 checkpoint needs: GLM's shared expert unfused (layout.UNFUSED_SHARED_EXPERT_ARCHS)."""
    from engine_patches.int4_moe.layout import FUSION_OFF, UNFUSED_SHARED_EXPERT_ARCHS

    ckpt = _int4_checkpoint(sglang_args)
    if ckpt and ckpt.architecture in UNFUSED_SHARED_EXPERT_ARCHS and FUSION_OFF not in sglang_args:
        return [FUSION_OFF]
    return []


def describe_int4_checkpoint(sglang_args: list[str]) -> list[str]:
    ckpt = _int4_checkpoint(sglang_args)
    if ckpt is None:
        return []
    line = (f"INT4 W4A16 g{ckpt.group_size}" if ckpt.fmt == "int4" else ckpt.fmt) + f" experts ({ckpt.architecture})"
    if int4_checkpoint_args(sglang_args):
        line += ": shared expert kept unfused (--disable-shared-experts-fusion)"
    return [line]


# ---- inside every SGLang process (called by boot/sitecustomize.py) ----


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a given module has been executed, in whatever process imports it."""

    def __init__(self, module: str, callbacks: list):
        self.module, self.callbacks = module, callbacks

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callbacks = spec.loader.exec_module, self.callbacks

        def exec_then_patch(module):
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_patch
        return spec


def after_import(module: str, callback) -> None:
    """Run `callback()` once `module` is imported in this process: now if it already is."""
    if module in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(module, [callback]))


def install_hooks() -> list[str]:
    """Read CAPBENCH_PATCHES and hook every active patch onto its trigger module; returns the hooked names."""
    raw = os.environ.get(ENV)
    if not raw:
        return []
    o = PatchOptions(**json.loads(raw))
    by_module: dict[str, list] = {}
    for p in active_patches(o):
        module_name, func_name = p.apply.split(":")

        def callback(module_name=module_name, func_name=func_name):
            getattr(importlib.import_module(module_name), func_name)(o)

        by_module.setdefault(p.trigger_module, []).append(callback)
    for module, callbacks in by_module.items():
        if module in sys.modules:
            for callback in callbacks:
                callback()
        else:
            sys.meta_path.insert(0, _AfterImport(module, callbacks))
    return [p.name for p in active_patches(o)]
