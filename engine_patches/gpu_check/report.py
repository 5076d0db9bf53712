"""The GPU check's table, its files (the run's JSON, and its figures as kernel-table Parquet: tables.py) and its
command line (`python -m engine_patches.gpu_check`, and `capbench gpu-check`, which calls `main`)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from engine_patches.gpu_check.run import NO_GPU

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "calibration" / "gpu_check.json"


def table(result: dict) -> list[str]:
    lines = [f"capbench gpu-check on {result['device']} ({'PENDING: not GPU figures' if result['pending'] else 'GPU'})"
             f", {result['wall_s']} s (per section: {result['section_s']})"]
    lines.append("decode attention, one layer's forward_decode (x layers = the step's attention):")
    lines.append(f"  {'shape':<62}{'kernel':<58}{'ms/layer':>10}{'step ms':>10}")
    for r in result["decode_attention"]:
        mark = (" [SGLang default]" if r["sglang_default"] else "") + (" [launch line]" if r["launch_line"] else "")
        lines.append(f"  {r['shape']:<62}{r['kernel'][:57]:<58}{r['ms_per_layer']:>10.4f}{r['step_ms']:>10.3f}{mark}")
    lines.append("KV checksums per decode step (seal + admission and insert checks spread over the answer):")
    lines.append(f"  {'model':<9}{'kv':<6}{'batch':>6}{'context':>8}{'answer':>7}  {'backend':<12}{'checksum ms':>12}"
                 f"{'step ms':>10}{'share':>9}")
    for r in result["checksum_overhead"]:
        lines.append(f"  {r['model']:<9}{r['kv']:<6}{r['batch']:>6}{r['context']:>8}{r['answer_tokens']:>7}  "
                     f"{r['backend']:<12}{r['checksum_ms']:>12.4f}{r['decode_step_ms']:>10.3f}{r['share']:>9.3%}")
    lines.append("KV checksums, HiCache load-back: host-copy check (CPU, scheduler thread) vs device check:")
    for ck in result["checksum"]:
        for r in ck.get("hicache_loads", []):
            lines.append(f"  {ck['model']:<9}{ck['kv']:<6}{r['tokens']:>7} tokens {r['bytes'] / 1e6:>9.1f} MB  host "
                         f"{r['host_check_ms']:>9.2f} ms ({r['host_GBps']:.2f} GB/s)  "
                         f"device {r['device_check_ms']:>8.3f} ms"
                         + (f"  GPU kernel reading host memory {r['gpu_read_of_host_ms']:.2f} ms"
                            if r.get("gpu_read_of_host_ms") else ""))
    lines.append("MoE, one layer's local experts (EP8):")
    lines.append(f"  {'shape':<86}{'kernel':<26}{'ms':>9}")
    for r in result["moe"]:
        lines.append(f"  {r['shape']:<86}{r['kernel']:<26}{r['ms']:>9.4f}")
    lines.append(f"FP8 vs BF16 KV, median time ratio per model and backend: {fmt(fp8_speedup(result))}")
    lines.append(f"INT4 / FP8 vs BF16 experts, median time ratio: {fmt(moe_speedup(result))}")
    samples = result["nvml_samples"]
    lines.append(f"NVML: {len(samples)} samples" + (f", max power {max(s['power_w'] for s in samples):.0f} W"
                                                     if samples else " (none: no GPU, or NVML failed)"))
    for u in result["unavailable"]:
        lines.append(f"not tried here: {u['kernel']} ({u['model']}): {u['why']}")
    for s in result["skipped_for_time"]:
        lines.append(f"SKIPPED for time: {s}")
    for e in result["errors"]:
        scope = " ".join(str(x) for x in e["scope"])
        lines.append(f"ERROR {e['section']} [{e['kernel']}{' ' + scope if scope else ''}]: {e['error']}"
                     + (f" ({e['cases_not_tried']} more cases of it not tried)" if e["cases_not_tried"] else ""))
    return lines


def fmt(ratios: dict) -> str:
    return ", ".join(f"{k} x{v:.2f}" for k, v in ratios.items()) or "none measured"


def fp8_speedup(result: dict) -> dict:
    """Median BF16 / FP8 time per (model, backend) over the batch x context both were timed at."""
    rows = result["decode_attention"]
    index = {(r["model"], r["backend"], r["batch"], r["context"], r["kv"]): r["ms_per_layer"] for r in rows}
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r["kv"] == "fp8" and (b := index.get((r["model"], r["backend"], r["batch"], r["context"], "bf16"))):
            ratios.setdefault(f"{r['model']} {r['backend']}", []).append(b / r["ms_per_layer"])
    return {k: statistics.median(v) for k, v in ratios.items()}


def moe_speedup(result: dict) -> dict:
    """Median BF16 (Triton) / other-format time per (model, format) over the token counts both were timed at."""
    rows = result["moe"]
    base = {(r["model"], r["tokens"]): r["ms"] for r in rows if r["weights"] == "bf16"}
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r["weights"] != "bf16" and (b := base.get((r["model"], r["tokens"]))):
            ratios.setdefault(f"{r['model']} {r['weights']}", []).append(b / r["ms"])
    return {k: statistics.median(v) for k, v in ratios.items()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="capbench gpu-check", description="Time what SGLang runs, on one GPU.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    p.add_argument("--tables", type=Path, default=None,
                   help="folder for attention.parquet and moe.parquet (default: <out>'s name without .json, + _tables)")
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip (and list) cases past this many seconds")
    p.add_argument("--context", default=None,
                   help="JSON from capbench's CLI: the GPU's catalog id, each model's server KV pool tokens per KV "
                        "dtype, SGLang's default and the launch line's backend")
    return p.parse_args(argv)


def _writable(path: Path) -> str | None:
    try:  # a path that cannot be written fails now, not after the run
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".{os.getpid()}.probe"
        probe.touch()
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    """0: every kernel tried was timed; 1: some could not run (named); 2: no GPU and no --quick, or bad paths."""
    args = parse(argv)
    import torch

    if not args.quick and not torch.cuda.is_available():
        print(f"error: {NO_GPU}", file=sys.stderr)
        return 2
    tables_dir = args.tables or args.out.with_name(args.out.stem + "_tables")
    for flag, folder in (("--out", args.out.parent), ("--tables", tables_dir)):
        if (why := _writable(folder)) is not None:
            print(f"error: {flag} {folder}: cannot write ({why})", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel is defined
    try:  # what every section needs: one line if this environment cannot give it
        import sglang.srt.mem_cache.memory_pool  # noqa: F401
        import sglang.srt.server_args  # noqa: F401
    except Exception as e:  # noqa: BLE001 - e.g. a torchvision built for another torch
        print(f"error: gpu-check cannot import SGLang's runtime here: {type(e).__name__}: {str(e)[:200]}",
              file=sys.stderr)
        return 2
    from engine_patches.gpu_check import tables
    from engine_patches.gpu_check.run import run

    result = run(args)
    print("\n".join(table(result)), flush=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    try:
        for path in tables.write(result["kernel_tables"], tables_dir, result["pending"]):
            print(f"wrote {path}")
    except ImportError as e:
        print(f"kernel tables not written as Parquet ({e}); the JSON's kernel_tables carry the rows: "
              f"capbench gpu-check-merge {args.out}", file=sys.stderr)
    if result["errors"]:
        print(f"error: {len(result['errors'])} kernel scope(s) could not be timed: "
              + "; ".join(" ".join([e["kernel"], *map(str, e["scope"])]) for e in result["errors"]), file=sys.stderr)
        return 1
    return 0
