"""What capbench changes in SGLang, from the command line: `sglang-launch` (SGLang with the patches in every
process), `calibrate-kv-scales` (per-layer FP8 KV scales), `quantize-experts` (routed experts to INT4, FP8 block-128
or NVFP4) and `quantize-int4` (its INT4 path). engine_patches is
imported inside each command: the rest of the CLI runs without torch or SGLang."""

from __future__ import annotations

import typer

from bench.errors import BadInput


def sglang_launch(
    ctx: typer.Context,
    kv_checksum: str = typer.Option("off", help="KV page checksums: off | verify (evict a bad page and recompute) "
                                    "| strict (abort the request). Sealed on radix insert, verified on match_prefix."),
    kv_scrub_pages_per_s: float = typer.Option(0.0, help="Re-verify idle cached pages at this rate (0: no scrub)."),
    integrity_log: str = typer.Option(None, help="Append integrity events (kind, layer, page, detail) as JSON lines."),
    kv_scales: str = typer.Option(None, help="Per-layer FP8 KV scales (from calibrate-kv-scales) for GLM-4.x / Kimi "
                                  "K2; needs --kv-cache-dtype fp8_e4m3."),
    record_kv_amax: str = typer.Option(None, help="Calibration run (BF16 KV): dump per-layer K/V maxima to "
                                       "PATH.rank<R>.json for calibrate-kv-scales."),
    dry_run: bool = typer.Option(False, help="Print the command and environment instead of starting SGLang."),
) -> None:
    """Start SGLang (python -m sglang.launch_server) with capbench's patches in every SGLang process.

    Everything after `--` goes to sglang.launch_server, e.g.
    capbench sglang-launch --kv-checksum verify -- --model-path moonshotai/Kimi-K2-Thinking --tp 8

    The patches reach SGLang's spawned scheduler processes through engine_patches/boot/sitecustomize.py, put first
    on PYTHONPATH, with the options in the CAPBENCH_PATCHES environment variable.
    """
    from bench.cli import attention_check
    from bench.kv_scales import check_scales
    from engine_patches.launch import BadLaunch, PatchOptions, launch, server_arguments, validate

    args = list(ctx.args)
    if kv_scales and (wrong := check_scales(kv_scales)) is not None:  # before SGLang loads it on every rank
        raise BadInput(f"--kv-scales {wrong}")
    try:
        options = PatchOptions(kv_checksum, kv_scrub_pages_per_s, integrity_log, kv_scales, record_kv_amax)
        validate(options, args)
        for note in attention_check.check(kv_scales, server_arguments(args)):
            print(f"note: {note}")
        launch(options, args, dry_run=dry_run)
    except BadLaunch as e:
        raise BadInput(str(e)) from None


def calibrate_kv_scales(
    target: str = typer.Option(..., help="Base URL of a BF16-KV SGLang started by `capbench sglang-launch "
                               "--record-kv-amax PATH` on this host."),
    amax: str = typer.Option(..., help="The PATH given to --record-kv-amax (ranks dump PATH.rank<R>.json)."),
    out: str = typer.Option(..., help="Scales file to write (for --kv-scales / SGLang's --quantization-param-path)."),
    prompts: str = typer.Option(None, help="JSONL with a 'prompt' per line, or one prompt a line "
                                "(default: data/prompts/kv_calibration.jsonl)."),
    margin: float = typer.Option(1.0, help="Headroom over the calibrated maximum (>= 1): scale = amax*margin/448."),
    tp_size: int = typer.Option(None, help="TP size of the FP8 deployment (default: the ranks that dumped)."),
    num_layers: int = typer.Option(None, help="Model layers (default: highest layer seen + 1)."),
    model_type: str = typer.Option(None, help="config.json model_type to record (SGLang's loader checks it)."),
    max_tokens: int = typer.Option(16, help="Tokens to generate per calibration prompt."),
) -> None:
    """Record per-layer K/V maxima on a BF16-KV server and write per-layer FP8 KV scales."""
    try:
        from engine_patches.fp8_scales.calibrate import calibrate

        r = calibrate(target, amax, out, prompts, margin, max_tokens, tp_size, num_layers, model_type)
    except (ValueError, OSError) as e:
        raise BadInput(str(e)) from None
    except ImportError as e:
        raise BadInput(f"calibrate-kv-scales needs the engine extras (pip install 'capbench[engine]'): {e}") from None
    print(f"wrote {r.out}: {r.layers} {r.layout.upper()} layers x {r.ranks} TP ranks, {r.tokens_seen} tokens seen; "
          f"max |K/V| {r.max_amax:.1f}; {r.layers_past_e4m3} layers exceed 448 (saturate at scale 1.0)")


def quantize_int4(
    src: str = typer.Option(..., "--in", help="Checkpoint directory: safetensors, BF16 or FP8 block-128."),
    out: str = typer.Option(..., "--out", help="New directory for the INT4 checkpoint (written as OUT.partial, "
                            "renamed when complete)."),
    group_size: int = typer.Option(32, help="INT4 group size: 32 (as Kimi K2 Thinking) or 128."),
    tp: int = typer.Option(8, help="Tensor parallelism the checkpoint will be served at (the group size must divide "
                           "each rank's share of the expert intermediate size)."),
    ep: int = typer.Option(1, help="Expert parallelism it will be served at."),
    workers: int = typer.Option(None, help="Worker processes (default: the machine's cores, bounded by memory)."),
    resume: bool = typer.Option(False, help="Continue an interrupted conversion from OUT.partial."),
) -> None:
    """Routed experts of a GLM-4.x / Kimi K2 checkpoint to compressed-tensors INT4 W4A16 (SGLang loads it)."""
    try:
        from engine_patches.int4_moe.convert import convert, print_report

        report = convert(src, out, group_size, tp, ep, workers, resume)
    except (ValueError, OSError) as e:
        raise BadInput(str(e)) from None
    except ImportError as e:
        raise BadInput(f"quantize-int4 needs the engine extras (pip install 'capbench[engine]'): {e}") from None
    print_report(report, out)


def quantize_experts(
    fmt: str = typer.Option(..., "--format", help="int4-g32 | int4-g128 | fp8-block128 | nvfp4 (weight-only NVFP4) | "
                            "mxfp4 (refused: SGLang 0.5.23 does not load it for these models)"),
    src: str = typer.Option(..., "--in", help="Checkpoint directory: safetensors, BF16, FP8 block-128 or INT4 "
                            "(compressed-tensors pack-quantized, as Kimi K2 Thinking ships)."),
    out: str = typer.Option(..., "--out", help="New directory for the converted checkpoint (written as OUT.partial, "
                            "renamed when complete)."),
    tp: int = typer.Option(8, help="Tensor parallelism the checkpoint will be served at (each MoE rank must hold "
                           "whole scale groups of expert rows)."),
    ep: int = typer.Option(1, help="Expert parallelism it will be served at."),
    workers: int = typer.Option(None, help="Worker processes (default: the machine's cores, bounded by memory)."),
    resume: bool = typer.Option(False, help="Continue an interrupted conversion from OUT.partial."),
) -> None:
    """Routed experts of a GLM-4.x / Kimi K2 checkpoint to another expert format, written as SGLang 0.5.23 loads it;
    prints the error against the input per layer."""
    try:
        from engine_patches.int4_moe.schemes import scheme

        scheme(fmt)  # an unknown or refused format: one line before the engine extras are imported
        from engine_patches.int4_moe.convert import convert, print_report

        report = convert(src, out, tp=tp, ep=ep, workers=workers, resume=resume, fmt=fmt)
    except (ValueError, OSError) as e:
        raise BadInput(str(e)) from None
    except ImportError as e:
        raise BadInput(f"quantize-experts needs the engine extras (pip install 'capbench[engine]'): {e}") from None
    print_report(report, out)
