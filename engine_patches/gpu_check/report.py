"""The GPU check's table, its JSON file and its command line (`python -m engine_patches.gpu_check`, and
`capbench gpu-check`, which calls `main`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine_patches.gpu_check.run import NO_GPU

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "calibration" / "gpu_check.json"


def table(result: dict) -> list[str]:
    lines = [f"capbench gpu-check on {result['device']} ({'PENDING: not GPU figures' if result['pending'] else 'GPU'})"
             f", {result['wall_s']} s; SGLang defaults here: {result['sglang_defaults']}"]
    lines.append("decode attention, one layer (x layers = the step):")
    lines.append(f"  {'shape':<58}{'kernel':<44}{'ms/layer':>10}{'step ms':>10}")
    for r in result["decode_attention"]:
        lines.append(f"  {r['shape']:<58}{r['kernel']:<44}{r['ms_per_layer']:>10.4f}{r['step_ms']:>10.3f}")
    lines.append("KV checksums per decode step (seal + admission and insert checks spread over the output):")
    lines.append(f"  {'model':<9}{'kv':<6}{'batch':>6}{'ctx':>7}  {'vs backend':<12}{'checksum ms':>12}"
                 f"{'step ms':>10}{'share':>9}")
    for r in result["checksum_overhead"]:
        lines.append(f"  {r['model']:<9}{r['kv']:<6}{r['batch']:>6}{r['context']:>7}  {r['backend']:<12}"
                     f"{r['checksum_ms']:>12.4f}{r['decode_step_ms']:>10.3f}{r['share']:>9.3%}")
    for ck in result["checksum"]:
        worst = max(ck["steps"], key=lambda s: s["admission_check_ms"])
        lines.append(f"  {ck['shape']} [{ck['kernel']}]: admission check at ctx {worst['context']} "
                     f"{worst['admission_check_ms']:.3f} ms (host sync included)")
    lines.append("MoE, one layer's local experts:")
    lines.append(f"  {'shape':<70}{'kernel':<50}{'ms':>9}")
    for r in result["moe"]:
        lines.append(f"  {r['shape']:<70}{r['kernel']:<50}{r['ms']:>9.4f}")
    lines.append(f"FP8 vs BF16 KV decode speed-up (median): {fmt(result['fp8_kv_speedup'])}")
    lines.append(f"INT4 vs BF16 (Triton) MoE speed-up (median): {fmt(result['int4_moe_speedup'])}")
    samples = result["nvml_samples"]
    lines.append(f"NVML: {len(samples)} samples" + (f", max power {max(s['power_w'] for s in samples):.0f} W"
                                                     if samples else " (none: no GPU, or NVML failed)"))
    for e in result["unavailable"]:
        lines.append(f"unavailable (not SGLang's default here): {e['error']}")
    for s in result["skipped_for_time"]:
        lines.append(f"SKIPPED for time: {s}")
    for e in result["errors"]:
        lines.append(f"ERROR {e['section']}: {e['error']}")
    return lines


def fmt(speedups: dict) -> str:
    return ", ".join(f"{k} x{v:.2f}" for k, v in speedups.items()) or "none measured"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="capbench gpu-check", description="Time what SGLang runs by default, on one GPU.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip (and list) cases past this many seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """0: every kernel SGLang runs by default was timed; 1: some could not run (named); 2: no GPU, no --quick."""
    args = parse(argv)
    import torch

    if not args.quick and not torch.cuda.is_available():
        print(f"error: {NO_GPU}", file=sys.stderr)
        return 2
    try:  # a path that cannot be written fails now, not after the run
        args.out.parent.mkdir(parents=True, exist_ok=True)
        probe = args.out.with_name(f".{args.out.name}.probe")
        probe.touch()
        probe.unlink()
    except OSError as e:
        print(f"error: --out {args.out}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel is defined
    from engine_patches.gpu_check.run import run

    result = run(args)
    print("\n".join(table(result)), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if result["errors"]:
        print(f"error: {len(result['errors'])} kernel(s) SGLang would run could not be timed: "
              + "; ".join(e["kernel"] for e in result["errors"]), file=sys.stderr)
        return 1
    return 0
