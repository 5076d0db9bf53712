"""`capbench gpu-check`: the one GPU command (engine_patches/gpu_check), imported only when it runs: the rest of the
CLI needs no torch. The CLI gives the check what only capbench's model knows: the card's catalog entry, each model's
KV pool on it as a server at TP8 sizes it (bench/model/fits/capacity.py), and which backend SGLang picks and which the
launch line names (bench/model/fits/backend.py). `capbench gpu-check-merge` adds a run's figures to data/kernels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer

from bench import checks
from bench.errors import BadInput

NEEDS = ("gpu-check needs torch, triton and the sglang wheel: pip install 'capbench[engine]' and "
         "pip install --no-deps sglang==0.5.23")
MODELS = {"kimi-k2": "kimi-k2-thinking", "glm-4.6": "glm-4.6"}  # the check's shapes -> the catalog's models
TP = 8


def catalog_gpu(device_name: str) -> str | None:
    """The catalog GPU whose marketed name (H200, H100, B200, A100, MI300X) is a word of the device's name."""
    from bench.model import catalog

    words = set(re.split(r"[\s_-]+", device_name.upper()))
    for gpu_id, gpu in catalog.gpus().items():
        marketed = re.search(r"\b[A-Z]{1,3}\d{2,4}[A-Z]?\b", gpu.name.upper())
        if marketed and marketed.group() in words:
            return gpu_id
    return None


def gpu_context(gpu_id: str) -> dict:
    """Per model: the KV pool tokens one GPU of a TP8 server holds (BF16 and FP8 KV, native weights), SGLang's
    default attention backend and the one capbench's launch line names."""
    from bench.model import Deployment, backend, capacity, catalog

    gpu = catalog.gpu(gpu_id)
    out = {"gpu": gpu_id, "default_page_size": gpu.default_page_size, "tp": TP, "models": {}}
    for short, model_id in MODELS.items():
        model = catalog.model(model_id)
        pools, launch = {}, {}
        for kv, dtype in (("bf16", "bf16"), ("fp8", "fp8_e4m3")):
            try:
                dep = Deployment(model, gpu, TP, kv_dtype=dtype)
            except BadInput:  # no backend runs it here
                continue
            pools[kv] = capacity.capacity(dep, with_ratios=False).kv_pool_tokens
            launch[kv] = dep.attention
        out["models"][short] = {"catalog": model_id, "pool_tokens": pools, "launch": launch,
                                "default": backend.default_backend(model, gpu, TP)}
    return out


def gpu_check(
    out: str = typer.Option(None, help="JSON file to write (default data/calibration/gpu_check.json)."),
    tables: str = typer.Option(None, help="Folder for the kernel-table Parquet (default: beside --out, "
                               "<name>_tables)."),
    quick: bool = typer.Option(False, help="Tiny shapes on the CPU under TRITON_INTERPRET=1: the code path and the "
                               "files, not GPU figures."),
    budget_s: float = typer.Option(420.0, help="Skip, and list, the cases left after this many seconds."),
) -> None:
    """Time on one GPU what SGLang runs: each attention backend's decode step BF16 vs FP8 KV, KV checksum overhead
    per decode step, MoE experts BF16 / FP8 / INT4 (Triton and Marlin), with NVML samples; the figures also as
    kernel tables (capbench gpu-check-merge adds them to data/kernels). Exit 1 when a kernel could not run."""
    if not 0 < budget_s <= 3600:
        raise BadInput(f"--budget-s must be in (0, 3600], got {budget_s}")
    if tables:
        tables = checks.output_dir("--tables", tables)
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        raise BadInput(f"{NEEDS} ({e})") from None
    from engine_patches.gpu_check.report import main

    argv = (["--out", out] if out else []) + (["--tables", tables] if tables else []) + (["--quick"] if quick else [])
    if not quick and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        gpu_id = catalog_gpu(name)
        if gpu_id is None:
            typer.echo(f"note: {name} is not in the GPU catalog: KV pools are sized to each batch, not to a server's",
                       err=True)
        else:
            argv += ["--context", json.dumps({**gpu_context(gpu_id), "device": name})]
    code = main(argv + ["--budget-s", str(budget_s)])
    if code:
        raise typer.Exit(code)


def gpu_check_merge(
    run: str = typer.Argument(..., help="A gpu-check JSON file (its kernel_tables)."),
    kernels: str = typer.Option(None, help="The kernel tables' folder (default data/kernels)."),
) -> None:
    """Add a gpu-check run's figures to the kernel tables the performance model reads (data/kernels): its rows replace
    earlier ones of the same GPU and SGLang version, sources.yaml names the run."""
    from bench import gpu_tables
    from bench.model import catalog

    path = Path(checks.input_file("RUN", run))
    folder = Path(checks.output_dir("--kernels", kernels)) if kernels else catalog.DATA / "kernels"
    for name, rows in gpu_tables.merge(path, folder).items():
        typer.echo(f"{folder / (name + '.parquet')}: {rows} rows from {path.name}")
