"""`capbench formats`: the routed-expert weight formats side by side for one model on one GPU (why INT4, not NF4,
NVFP4 or MXFP4, answered per GPU)."""

from __future__ import annotations

import json

import typer


def formats(
    model: str = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking, glm-4.6)."),
    gpu: str = typer.Option(..., help="GPU id from data/gpus.yaml (e.g. h200, b200)."),
    tp: int = typer.Option(8, help="GPUs of one instance (tensor parallelism) every format is sized at."),
    kv_dtype: str = typer.Option("fp8_e4m3", help="bf16 | fp8_e4m3 | fp8_e5m2"),
    workload: str = typer.Option("chat", help="Workload (data/workloads name or YAML path) the prices assume."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO the tok/s and $ per 1M are the highest rate within."),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    price: float = typer.Option(None, help="$ per GPU-hour (default: the catalog's indicative price)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
) -> None:
    """Expert weight formats side by side: memory, KV room, predicted tok/s and $ per 1M, kernel, checkpoint,
    accuracy evidence."""
    from rich.console import Console

    from bench.model import format_table, parse_slo
    from bench.report import formats_table

    target = parse_slo(slo)
    found = format_table.rows(model, gpu, tp, kv_dtype, workload, target, context, price)
    if as_json:
        print(json.dumps([r.to_dict() for r in found], indent=2))
        return
    Console(width=max(Console().width, 170)).print(formats_table.table(found, format_table.describe(
        model, gpu, tp, kv_dtype, workload, target)))
    print("\n".join(formats_table.notes(found)))
