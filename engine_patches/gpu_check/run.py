"""The GPU check's run: every section in turn on one timeline, and an exit status that says whether every kernel it
tried was timed (0) or not (1). See __init__.py for what is measured.

A case that fails is one error naming its kernel and why, scoped to (kernel, model, KV dtype or expert format): the
later cases of that scope are not tried (and counted), every other scope still runs. Each section has a deadline
(a share of --budget-s, what an earlier section leaves passing on); a case past it is skipped and listed."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

FULL = {"batches": [1, 32, 256], "contexts": [4096, 32768], "moe_tokens": [1, 16, 64, 256, 1024, 4096, 8192],
        "warmup": 3, "iters": 20, "pool_gib": 16.0, "page_size": 64, "output_lens": [128, 1024],
        "load_contexts": [4096, 32768], "load_iters": 3}
# the interpreter runs a tiny decode call in ~1 s
QUICK = {"batches": [2], "contexts": [32], "moe_tokens": [4], "warmup": 0, "iters": 1, "pool_gib": 0.002,
         "page_size": 16, "output_lens": [16, 64], "load_contexts": [32], "load_iters": 1}
DEADLINES = {"decode_attention": 0.45, "checksum": 0.6, "moe": 1.0}  # cumulative shares of the budget
NO_GPU = ("no CUDA device: the GPU figures stay pending (no GPU lent); --quick runs the same code on tiny CPU "
          "shapes under TRITON_INTERPRET=1")


def models(quick: bool) -> dict:
    from engine_patches.gpu_check import attention, moe
    from engine_patches.kv_checksum import gpu_check as kv

    attn, experts, pools = (attention.TINY, moe.TINY, kv.QUICK) if quick else (attention.SHAPES, moe.SHAPES, kv.POOLS)
    return {"kimi-k2": {"attn": attn["kimi-k2"], "moe": experts["kimi-k2"], "pool": pools[0]},
            "glm-4.6": {"attn": attn["glm-4.6"], "moe": experts["glm-4.6"], "pool": pools[1]}}


class Check:
    """Rows, errors and the timeline of one run."""

    def __init__(self, device, quick: bool, budget_s: float, sampler=None):
        self.device, self.quick, self.budget_s, self.sampler = device, quick, budget_s, sampler
        self.t0 = time.monotonic()
        self.deadline = budget_s
        self.rows: dict[str, list[dict]] = {"decode_attention": [], "checksum": [], "checksum_overhead": [], "moe": []}
        self.errors: list[dict] = []  # a case that could not run: its kernel, scope, first case and why
        self.unavailable: list[dict] = []  # kernels not tried on this device (CUDA-only off CUDA, other archs)
        self.skipped: list[str] = []  # cases left out for time
        self.failed: dict[tuple, dict] = {}  # scope -> its error entry (later cases of the scope counted there)
        self.timeline: list[dict] = []

    def elapsed(self) -> float:
        return time.monotonic() - (self.sampler.t0 if self.sampler else self.t0)

    def section(self, name: str) -> None:
        self.deadline = self.budget_s * DEADLINES.get(name, 1.0)

    def not_tried(self, section: str, label: str, key: tuple) -> None:
        """A case left out because what it needs (key) failed, or for time."""
        if key in self.failed:
            self.failed[key]["cases_not_tried"] += 1
        else:
            self.skipped.append(f"{section}: {label}")

    def case(self, section: str, label: str, kernel_key: str, required: bool, fn, scope: tuple = ()) -> dict | None:
        """Run one case; a failure is recorded once for (kernel, *scope), never replaced by another kernel.
        `required` is kept for callers of the old interface: every failure is an error."""
        from engine_patches.gpu_check.kernels import KernelUnavailable

        key = (kernel_key, *scope)
        if key in self.failed:
            self.failed[key]["cases_not_tried"] += 1
            return None
        if time.monotonic() - self.t0 > self.deadline:
            self.skipped.append(f"{section}: {label}")
            return None
        start = self.elapsed()
        try:
            row = fn()
        except Exception as e:  # noqa: BLE001 - every failure becomes this scope's error line
            message = str(e) if isinstance(e, KernelUnavailable) else f"{kernel_key}: {type(e).__name__}: {e}"
            entry = {"section": section, "kernel": kernel_key, "scope": list(scope), "first_case": label,
                     "error": message[:400], "cases_not_tried": 0}
            self.failed[key] = entry
            self.errors.append(entry)
            where = " ".join(str(s) for s in scope)
            print(f"ERROR {section} [{kernel_key}{' ' + where if where else ''}]: {message[:400]}", file=sys.stderr,
                  flush=True)
            return None
        end = self.elapsed()
        row = {**row, "t_start_s": round(start, 4), "t_end_s": round(end, 4)}
        if self.sampler is not None:
            row["nvml"] = self.sampler.during(start, end)
        self.timeline.append({"section": section, "case": label, "t_start_s": row["t_start_s"],
                              "t_end_s": row["t_end_s"]})
        self.rows[section].append(row)
        return row


def attention_section(c: Check, specs: dict, sizes: dict, half, gpu_arch: str | None, context: dict) -> None:
    """Each model's backends (those SGLang runs on this arch), BF16 and FP8 KV, every batch x context: one layer's
    forward_decode on a pool of the server's size (context["pools"]), or of the batch's tokens where larger."""
    from engine_patches.gpu_check import attention
    from engine_patches.gpu_check.patched import Patches
    from engine_patches.gpu_check.timing import device_ms

    c.section("decode_attention")
    default_page = context.get("default_page_size", 1)
    with Patches() as patches:
        for model, spec in specs.items():
            shape = spec["attn"]
            names = attention.runnable(shape.kind, gpu_arch)
            for name in attention.BACKENDS[shape.kind]:
                if name not in names:
                    c.unavailable.append({"kernel": name, "model": model, "why": f"does not run on "
                                          f"{gpu_arch or 'CPU'} (data/attention_backends.yaml archs)"})
            info = context.get("models", {}).get(model, {})
            for kv in ("bf16", "fp8"):
                server = info.get("pool_tokens", {}).get(kv)
                pool = None
                for bs in sizes["batches"]:
                    for ctx in sizes["contexts"]:
                        need = bs * -(-(ctx + 1) // 64) * 64 + 64  # page 0 is SGLang's padding page
                        tokens = -(-max(server or 0, need) // 64) * 64
                        if pool is None or pool.tokens != tokens:
                            pool = None  # free the old one first
                            pool = _pool(c, attention, shape, model, kv, tokens, half)
                        for name in names:
                            label = attention.label(model, shape, name, bs, ctx, kv)
                            if pool is None:
                                c.not_tried("decode_attention", label, ("kv_pool", model, kv))
                                continue

                            def one(name=name, bs=bs, ctx=ctx, kv=kv, label=label, model=model, spec=spec,
                                    shape=shape, pool=pool, server=server, info=info):
                                call, kernel = attention.prepare(name, model, shape, pool, bs, ctx, c.device, patches,
                                                                 default_page)
                                ms, timing = device_ms(call, c.device, sizes["warmup"], sizes["iters"])
                                return {"model": model, "attention": shape.kind, "backend": name, "batch": bs,
                                        "context": ctx, "kv": kv, "heads": shape.heads, "kv_heads": shape.kv_heads,
                                        "shape": label, "kernel": kernel, "timing": timing, "ms_per_layer": ms,
                                        "layers": shape.layers, "step_ms": ms * shape.layers,
                                        "pool_tokens": pool.tokens, "server_pool_tokens": server,
                                        "beyond_server_pool": bool(server) and pool.tokens > server,
                                        "sglang_default": info.get("default") == name,
                                        "launch_line": info.get("launch", {}).get(kv) == name}

                            c.case("decode_attention", label, attention.KEY[name], True, one, (model, kv))


def _pool(c: Check, attention, shape, model: str, kv: str, tokens: int, half):
    """The section's pool for (model, kv); its failure (memory) is the pool's error, scoped like a kernel's."""
    row = c.case("decode_attention", f"{model} {kv} KV pool of {tokens} tokens", "kv_pool",
                 True, lambda: {"pool": attention.Pool(shape, kv, tokens, c.device, half)}, (model, kv))
    if row is None:
        return None
    c.rows["decode_attention"].pop()  # the pool is not a figure
    c.timeline[-1]["case"] += " (made)"
    return row["pool"]


def checksum_section(c: Check, specs: dict, sizes: dict) -> None:
    import torch

    from engine_patches.gpu_check import checksums

    c.section("checksum")
    for model, spec in specs.items():
        for kv, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
            label = f"{spec['pool'].name} {kv} KV, page {sizes['page_size']}, {sizes['pool_gib']:g} GiB pool"

            def one(spec=spec, dtype=dtype, kv=kv, label=label, model=model):
                out = checksums.costs(spec["pool"], dtype, sizes["batches"], sizes["contexts"], sizes["output_lens"],
                                      sizes["page_size"], sizes["pool_gib"], c.device, sizes)
                return {"model": model, "kv": kv, "shape": label, "kernel": out["steps"][0]["kernel"],
                        "steps": out["steps"], "hicache_loads": out["loads"]}

            c.case("checksum", label, "checksum", True, one)
    for ck in c.rows["checksum"]:
        for step in ck["steps"]:
            for a in c.rows["decode_attention"]:
                if (a["model"], a["kv"], a["batch"], a["context"]) == (ck["model"], ck["kv"], step["batch"],
                                                                       step["context"]):
                    c.rows["checksum_overhead"].append({
                        "model": ck["model"], "kv": ck["kv"], "batch": step["batch"], "context": step["context"],
                        "answer_tokens": step["answer_tokens"],
                        "backend": a["backend"], "kernel": a["kernel"], "shape": a["shape"],
                        "decode_step_ms": a["step_ms"], "checksum_ms": step["per_step_ms"],
                        "share": step["per_step_ms"] / a["step_ms"]})


def moe_section(c: Check, specs: dict, sizes: dict, half, formats: list[str]) -> None:
    """Each model's local experts in each format, over the step's tokens; weights made once per (model, format)."""
    from engine_patches.gpu_check import moe
    from engine_patches.gpu_check.timing import device_ms

    c.section("moe")
    for model, spec in specs.items():
        shape = spec["moe"]
        for fmt in formats:
            backend, dtype_name, fmt_name, kernel = moe.FORMATS[fmt]
            key = "marlin_moe" if backend == "marlin" else "triton_moe"
            made = c.case("moe", f"{model} {fmt} expert weights", key, True,
                          lambda shape=shape, fmt=fmt: {"experts": moe.Experts(shape, fmt, half, c.device)},
                          (model, fmt))
            if made is not None:  # else the cases below are counted on its error, or skipped for time
                c.rows["moe"].pop()
            experts = made["experts"] if made else None
            for tokens in sizes["moe_tokens"]:
                label = moe.label(model, shape, fmt, tokens)

                def one(tokens=tokens, label=label, fmt=fmt, backend=backend, kernel=kernel, model=model,
                        shape=shape, experts=experts, dtype_name=dtype_name, fmt_name=fmt_name):
                    ms, timing = device_ms(experts.call(tokens), c.device, sizes["warmup"], sizes["iters"])
                    return {"model": model, "backend": backend, "weights": fmt, "format": fmt_name,
                            "dtype": dtype_name, "tokens": tokens, "hidden": shape.hidden, "inter": shape.inter,
                            "experts": shape.experts, "local_experts": shape.local, "topk": shape.topk,
                            "moe_ep": shape.ep, "shape": label, "kernel": kernel, "timing": timing, "ms": ms}

                c.case("moe", label, key, True, one, (model, fmt))
            del experts, made


def run(args) -> dict:
    import json

    import torch

    from engine_patches import SGLANG_VERSION
    from engine_patches.gpu_check import attention, tables
    from engine_patches.gpu_check.kernels import default_w4a16_moe_backend

    quick = args.quick
    cuda = torch.cuda.is_available() and not quick
    device = torch.device("cuda" if cuda else "cpu")
    sizes = dict(QUICK if quick else FULL)
    half = torch.bfloat16 if cuda else torch.float16  # the CPU interpreter's tl.dot mishandles bf16
    capability = torch.cuda.get_device_capability() if cuda else None
    gpu_arch = attention.arch(capability)
    context = json.loads(args.context) if getattr(args, "context", None) else {}
    specs = models(quick)
    sampler, nvml_error = None, None
    if cuda:
        try:
            from engine_patches.gpu_check.nvml import NvmlSampler

            sampler = NvmlSampler(torch.cuda.current_device()).start()
        except Exception as e:  # noqa: BLE001 - reported as an error below
            nvml_error = f"nvml: {type(e).__name__}: {e}"
    c = Check(device, quick, args.budget_s, sampler)
    if nvml_error:
        c.errors.append({"section": "nvml", "kernel": "nvml", "scope": [], "first_case": "sampler",
                         "error": nvml_error, "cases_not_tried": 0})
    formats = ["bf16", "fp8", "int4"] + (["int4-marlin"] if cuda else [])
    if not cuda:
        c.unavailable.append({"kernel": "marlin_moe", "model": "all", "why": "CUDA-only (sgl-kernel)"})
    from engine_patches.gpu_check.patched import sglang_runtime

    sections = (("decode_attention", lambda: attention_section(c, specs, sizes, half, gpu_arch, context)),
                ("checksum", lambda: checksum_section(c, specs, sizes)),
                ("moe", lambda: moe_section(c, specs, sizes, half, formats)))
    section_s = {}
    with sglang_runtime():
        for name, section in sections:
            start = time.monotonic()
            section()
            section_s[name] = round(time.monotonic() - start, 1)
    if sampler is not None:
        sampler.stop()
    import sglang
    import triton

    device_name = torch.cuda.get_device_name() if cuda else "CPU (TRITON_INTERPRET=1)"
    versions = {"torch": torch.__version__, "triton": triton.__version__, "sglang": sglang.__version__}
    measured_at = datetime.now(UTC).isoformat(timespec="seconds")
    return {
        "device": device_name, "gpu": context.get("gpu"), "capability": list(capability) if capability else None,
        "arch": gpu_arch, "pending": not cuda, "sglang_target": SGLANG_VERSION,
        "note": "tiny CPU shapes under the Triton interpreter: the code path and the files, not GPU figures"
                if not cuda else "one layer per attention call; SGLang's MoE configs for this GPU (tuned or default)",
        "measured_at": measured_at, "versions": versions, "sizes": sizes, "dtype": str(half).removeprefix("torch."),
        "context": context, "w4a16_moe_default": default_w4a16_moe_backend(capability) if cuda else None,
        **c.rows,
        "kernel_tables": tables.rows(c.rows, context.get("gpu"), device_name, versions, measured_at),
        "nvml_samples": sampler.samples if sampler else [], "timeline": c.timeline,
        "errors": c.errors, "unavailable": c.unavailable, "skipped_for_time": c.skipped,
        "section_s": section_s, "wall_s": round(time.monotonic() - c.t0, 1),
    }
