"""`capbench gpu-check`: the one GPU command (engine_patches/gpu_check), imported only when it runs: the rest of the
CLI needs no torch."""

from __future__ import annotations

import typer

from bench.errors import BadInput

NEEDS = ("gpu-check needs torch, triton and the sglang wheel: pip install 'capbench[engine]' and "
         "pip install --no-deps sglang==0.5.23")


def gpu_check(
    out: str = typer.Option(None, help="JSON file to write (default data/calibration/gpu_check.json)."),
    quick: bool = typer.Option(False, help="Tiny shapes on the CPU under TRITON_INTERPRET=1: the code path and the "
                               "JSON, not GPU figures."),
    budget_s: float = typer.Option(420.0, help="Skip, and list, the cases left after this many seconds."),
) -> None:
    """Time on one GPU what SGLang runs by default: KV checksum overhead per decode step, FP8 vs BF16 decode
    attention, INT4 vs BF16 MoE (Marlin and Triton), with NVML samples. Exit 1 when a kernel could not run."""
    if not 0 < budget_s <= 3600:
        raise BadInput(f"--budget-s must be in (0, 3600], got {budget_s}")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as e:
        raise BadInput(f"{NEEDS} ({e})") from None
    from engine_patches.gpu_check.report import main

    argv = (["--out", out] if out else []) + (["--quick"] if quick else []) + ["--budget-s", str(budget_s)]
    code = main(argv)
    if code:
        raise typer.Exit(code)
