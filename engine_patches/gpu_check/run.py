"""The GPU check's run: every section in turn on one timeline, a table, a JSON file, and an exit status that says
whether every kernel SGLang would run by default was timed (0) or not (1). See __init__.py for what is measured."""

from __future__ import annotations

import platform
import statistics
import sys
import time
from datetime import UTC, datetime

FULL = {"batches": [1, 32, 256], "contexts": [4096, 32768], "moe_m": [1, 16, 64, 256], "warmup": 3, "iters": 20,
        "kv_splits": 16, "pool_gib": 16.0, "page_size": 64, "output_len": 1024}
QUICK = {"batches": [2], "contexts": [32], "moe_m": [4], "warmup": 0, "iters": 1, "kv_splits": 2,
         "pool_gib": 0.002, "page_size": 16, "output_len": 64}  # the interpreter runs a tiny decode call in ~1 s
NO_GPU = ("no CUDA device: the GPU figures stay pending (no GPU lent); --quick runs the same code on tiny CPU "
          "shapes under TRITON_INTERPRET=1")


def models(quick: bool) -> dict:
    from engine_patches import quant_gpu_check as q
    from engine_patches.kv_checksum import gpu_check as kv

    attn, moe, pools = (q.TINY_ATTN, q.TINY_MOE, kv.QUICK) if quick else (q.ATTN_MODELS, q.MOE_MODELS, kv.POOLS)
    return {"kimi-k2": {"attn": attn["kimi-k2"], "moe": moe["kimi-k2"], "pool": pools[0]},
            "glm-4.6": {"attn": attn["glm-4.6"], "moe": moe["glm-4.6"], "pool": pools[1]}}


class Check:
    """Rows, errors and the timeline of one run."""

    def __init__(self, device, quick: bool, budget_s: float, sampler):
        self.device, self.quick, self.budget_s, self.sampler = device, quick, budget_s, sampler
        self.t0 = time.monotonic()
        self.rows: dict[str, list[dict]] = {"decode_attention": [], "checksum": [], "checksum_overhead": [], "moe": []}
        self.errors: list[dict] = []  # a kernel SGLang runs by default (or the Triton baseline) that could not run
        self.unavailable: list[dict] = []  # a non-default kernel that could not run
        self.skipped: list[str] = []
        self.timeline: list[dict] = []
        self.failed_kernels: set[str] = set()

    def elapsed(self) -> float:
        return time.monotonic() - (self.sampler.t0 if self.sampler else self.t0)

    def case(self, section: str, label: str, kernel_key: str, required: bool, fn) -> dict | None:
        """Run one case; its failure is recorded against the kernel (once), never replaced."""
        from engine_patches.gpu_check.kernels import KernelUnavailable

        if kernel_key in self.failed_kernels:
            return None
        if time.monotonic() - self.t0 > self.budget_s:
            self.skipped.append(f"{section}: {label}")
            return None
        start = self.elapsed()
        try:
            row = fn()
        except Exception as e:  # noqa: BLE001 - every failure becomes this kernel's error line
            self.failed_kernels.add(kernel_key)
            message = str(e) if isinstance(e, KernelUnavailable) else f"{kernel_key}: {type(e).__name__}: {e}"
            entry = {"section": section, "kernel": kernel_key, "first_case": label, "error": message[:400]}
            (self.errors if required else self.unavailable).append(entry)
            print(f"{'ERROR' if required else 'unavailable'} {section}: {message[:400]}", file=sys.stderr, flush=True)
            return None
        end = self.elapsed()
        row = {**row, "t_start_s": round(start, 4), "t_end_s": round(end, 4)}
        if self.sampler is not None:
            row["nvml"] = self.sampler.during(start, end)
        self.timeline.append({"section": section, "case": label, "t_start_s": row["t_start_s"],
                              "t_end_s": row["t_end_s"]})
        self.rows[section].append(row)
        return row


def attention_section(c: Check, specs: dict, sizes: dict, dtype, backends: list[tuple[str, bool]]) -> None:
    from engine_patches.gpu_check import attention
    from engine_patches.gpu_check.timing import device_ms

    for model, spec in specs.items():
        shape = spec["attn"]
        for backend, required in backends:
            kernel_key = attention.KERNEL_NAMES["flashinfer_mla" if backend == "flashinfer" and shape["mla"]
                                                 else backend]
            for bs in sizes["batches"]:
                for ctx in sizes["contexts"]:
                    for kv in ("bf16", "fp8"):
                        label = attention.shape_label(model, shape, bs, ctx, kv)

                        def one(backend=backend, bs=bs, ctx=ctx, kv=kv, label=label, model=model, spec=spec,
                                shape=shape):
                            call, kernel = attention.prepare(backend, shape, ctx, bs, kv, dtype, c.device,
                                                             sizes["kv_splits"])
                            ms, timing = device_ms(call, c.device, sizes["warmup"], sizes["iters"])
                            return {"model": model, "backend": backend, "batch": bs, "context": ctx, "kv": kv,
                                    "shape": label, "kernel": kernel, "timing": timing, "ms_per_layer": ms,
                                    "layers": spec["pool"].layers, "step_ms": ms * spec["pool"].layers}

                        c.case("decode_attention", label, kernel_key, required, one)


def checksum_section(c: Check, specs: dict, sizes: dict) -> None:
    import torch

    from engine_patches.gpu_check import checksums

    for model, spec in specs.items():
        for kv, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
            label = f"{spec['pool'].name} {kv} KV, page {sizes['page_size']}, {sizes['pool_gib']:g} GiB pool"

            def one(spec=spec, dtype=dtype, kv=kv, label=label, model=model):
                rows = checksums.costs(spec["pool"], dtype, sizes["batches"], sizes["contexts"], sizes["output_len"],
                                       sizes["page_size"], sizes["pool_gib"], c.device, sizes)
                return {"model": model, "kv": kv, "shape": label, "kernel": rows[0]["kernel"], "steps": rows}

            c.case("checksum", label, "checksum", True, one)
    for ck in c.rows["checksum"]:
        for step in ck["steps"]:
            for a in c.rows["decode_attention"]:
                if (a["model"], a["kv"], a["batch"], a["context"]) == (ck["model"], ck["kv"], step["batch"],
                                                                       step["context"]):
                    c.rows["checksum_overhead"].append({
                        "model": ck["model"], "kv": ck["kv"], "batch": step["batch"], "context": step["context"],
                        "backend": a["backend"], "kernel": a["kernel"], "shape": a["shape"],
                        "decode_step_ms": a["step_ms"], "checksum_ms": step["per_step_ms"],
                        "share": step["per_step_ms"] / a["step_ms"]})


def moe_section(c: Check, specs: dict, sizes: dict, dtype, marlin: bool, marlin_required: bool) -> None:
    from engine_patches.gpu_check import moe
    from engine_patches.gpu_check.timing import device_ms

    variants = [("triton", "bf16", "triton_moe", True), ("triton", "int4", "triton_moe", True)]
    if marlin:
        variants.append(("marlin", "int4", "marlin_moe", marlin_required))
    for model, spec in specs.items():
        shape = spec["moe"]
        for m in sizes["moe_m"]:
            for backend, weights, key, required in variants:
                label = moe.shape_label(model, shape, m, weights)

                def one(backend=backend, weights=weights, m=m, label=label, model=model, shape=shape):
                    call, kernel = (moe.triton_call(shape, m, weights, dtype, c.device) if backend == "triton"
                                    else moe.marlin_call(shape, m, dtype, c.device))
                    ms, timing = device_ms(call, c.device, sizes["warmup"], sizes["iters"])
                    return {"model": model, "backend": backend, "weights": weights, "m": m, "shape": label,
                            "kernel": kernel, "timing": timing, "ms": ms,
                            "weight_gbps": moe.weight_bytes(shape, weights) / ms / 1e6}

                c.case("moe", label, key if backend == "marlin" else "triton_moe", required, one)


def speedup(rows: list[dict], keys: tuple[str, ...], field: str, slow: str, fast: str) -> dict:
    """Median slow/fast time ratio per (model, backend) over the cases both were timed at."""
    t = "step_ms" if "step_ms" in (rows[0] if rows else {}) else "ms"
    index = {tuple(r[k] for k in keys) + (r[field],): r[t] for r in rows}
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r[field] == fast and (base := index.get(tuple(r[k] for k in keys) + (slow,))):
            ratios.setdefault(f"{r['model']} {r['backend']}", []).append(base / r[t])
    return {k: statistics.median(v) for k, v in ratios.items()}


def moe_speedup(rows: list[dict]) -> dict:
    """Median BF16 (Triton) / INT4 time per (model, INT4 backend) over the M both were timed at."""
    base = {(r["model"], r["m"]): r["ms"] for r in rows if r["weights"] == "bf16"}
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r["weights"] == "int4" and (b := base.get((r["model"], r["m"]))):
            ratios.setdefault(f"{r['model']} {r['backend']}", []).append(b / r["ms"])
    return {k: statistics.median(v) for k, v in ratios.items()}


def run(args) -> dict:
    quick = args.quick
    import torch

    cuda = torch.cuda.is_available() and not quick
    device = torch.device("cuda" if cuda else "cpu")
    sizes = dict(QUICK if quick else FULL)
    dtype = torch.bfloat16 if cuda else torch.float16  # the CPU interpreter's tl.dot mishandles bf16
    capability = torch.cuda.get_device_capability() if cuda else None
    from engine_patches.gpu_check.kernels import default_decode_backend, default_w4a16_moe_backend

    specs = models(quick)
    sampler = None
    nvml_error = None
    if cuda:
        try:
            from engine_patches.gpu_check.nvml import NvmlSampler

            sampler = NvmlSampler(torch.cuda.current_device()).start()
        except Exception as e:  # noqa: BLE001 - reported as an error below
            nvml_error = f"nvml: {type(e).__name__}: {e}"
    c = Check(device, quick, args.budget_s, sampler)
    if nvml_error:
        c.errors.append({"section": "nvml", "kernel": "nvml", "first_case": "sampler", "error": nvml_error})
    defaults = {}
    if cuda:
        from importlib.util import find_spec

        flashinfer = find_spec("flashinfer") is not None
        defaults = {kind: default_decode_backend(kind, capability, flashinfer) for kind in ("mla", "gqa")}
        backends = [("triton", True)] + [(b, b in defaults.values()) for b in ("fa3", "flashinfer")]
    else:
        backends = [("triton", True)]  # FA3, FlashInfer and Marlin are CUDA-only: not part of the CPU run
    attention_section(c, specs, sizes, dtype, backends)
    checksum_section(c, specs, sizes)
    moe_default = default_w4a16_moe_backend(capability) if cuda else "triton"
    moe_section(c, specs, sizes, dtype, marlin=cuda, marlin_required=moe_default == "marlin")
    if sampler is not None:
        sampler.stop()
    import sglang
    import triton

    return {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'cpu'}), TRITON_INTERPRET",
        "capability": list(capability) if capability else None,
        "pending": not cuda,
        "note": "tiny CPU shapes under the Triton interpreter: the code path and the JSON, not GPU figures"
                if not cuda else "one layer per attention call; default (untuned) Triton MoE configs",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "sglang": sglang.__version__},
        "sizes": sizes, "dtype": str(dtype).removeprefix("torch."),
        "sglang_defaults": {"decode_attention": defaults or None, "w4a16_moe": moe_default if cuda else None},
        **c.rows,
        "fp8_kv_speedup": speedup(c.rows["decode_attention"], ("model", "backend", "batch", "context"), "kv",
                                  "bf16", "fp8"),
        "int4_moe_speedup": moe_speedup(c.rows["moe"]),
        "nvml_samples": sampler.samples if sampler else [], "timeline": c.timeline,
        "errors": c.errors, "unavailable": c.unavailable, "skipped_for_time": c.skipped,
        "wall_s": round(time.monotonic() - c.t0, 1),
    }
