"""The GPU check's figures as rows of the kernel tables capbench's performance model reads (data/kernels/README.md:
attention.parquet and moe.parquet, one layer's latency in ms), each row with its provenance: the device it ran on,
the torch / triton / sglang versions, when, and "capbench gpu-check". `capbench gpu-check-merge` adds them to
data/kernels.

Attention: phase decode, `length` = the KV tokens each sequence holds before the new one, `heads` / `kv_heads` on one
GPU, `kv_dtype` bf16 or fp8_e4m3, `backend` SGLang's --attention-backend, `kernel` the backend's forward_decode and
the kernel it calls; `pool_tokens` the KV pool the call ran on (fa3's FP8 MLA read casts all of it). MoE: `experts`
the model's routed experts, moe_ep 8, moe_tp 1, distribution balanced, `tokens` the step's tokens before routing,
`dtype` AIConfigurator's moe dtype (bfloat16, fp8_block, int4_wo) and `format` capbench's (bf16, fp8-block128,
int4-g32)."""

from __future__ import annotations

import json
from pathlib import Path

ATTENTION = ["gpu", "sglang", "attention", "phase", "kernel", "backend", "kv_dtype", "heads", "kv_heads", "batch",
             "length", "latency_ms"]
MOE = ["gpu", "sglang", "kernel", "dtype", "format", "hidden", "inter", "experts", "topk", "moe_tp", "moe_ep",
       "distribution", "tokens", "latency_ms"]
PROVENANCE = ["device", "torch", "triton", "measured_at", "source", "timing"]
EXTRA = {"attention": ["pool_tokens"], "moe": []}
KV = {"bf16": "bf16", "fp8": "fp8_e4m3"}
SOURCE = "capbench gpu-check"


def gpu_id(gpu: str | None, device: str) -> str:
    """capbench's GPU id when the CLI found it in the catalog, else the device's name as a slug."""
    if gpu:
        return gpu
    return "cpu" if device.startswith("CPU") else device.lower().replace("nvidia ", "").replace(" ", "-")


def rows(sections: dict, gpu: str | None, device: str, versions: dict, measured_at: str) -> dict[str, list[dict]]:
    base = {"gpu": gpu_id(gpu, device), "sglang": versions["sglang"]}
    prov = {"device": device, "torch": versions["torch"], "triton": versions["triton"], "measured_at": measured_at,
            "source": SOURCE}
    attention = [{**base, "attention": r["attention"], "phase": "decode", "kernel": r["kernel"],
                  "backend": r["backend"], "kv_dtype": KV[r["kv"]], "heads": r["heads"], "kv_heads": r["kv_heads"],
                  "batch": r["batch"], "length": r["context"], "latency_ms": r["ms_per_layer"], **prov,
                  "timing": r["timing"], "pool_tokens": r["pool_tokens"]}
                 for r in sections["decode_attention"]]
    moe = [{**base, "kernel": r["kernel"], "dtype": r["dtype"], "format": r["format"], "hidden": r["hidden"],
            "inter": r["inter"], "experts": r["experts"], "topk": r["topk"], "moe_tp": 1, "moe_ep": r["moe_ep"],
            "distribution": "balanced", "tokens": r["tokens"], "latency_ms": r["ms"], **prov, "timing": r["timing"]}
           for r in sections["moe"]]
    return {"attention": attention, "moe": moe}


def columns(name: str) -> list[str]:
    return (ATTENTION if name == "attention" else MOE) + PROVENANCE + EXTRA[name]


def write(tables: dict[str, list[dict]], out_dir: Path, pending: bool) -> list[Path]:
    """attention.parquet and moe.parquet in out_dir, columns in the tables' order, the run's provenance also in the
    schema metadata (key `capbench`). Needs pyarrow (capbench's CLI has it; a bare GPU host may not: the JSON then
    carries the same rows and `capbench gpu-check-merge` writes them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows_ in tables.items():
        cols = columns(name)
        data = {c: [r[c] for r in rows_] for c in cols}
        types = {c: pa.float32() if c == "latency_ms" else pa.int32() if c in INTS else pa.string() for c in cols}
        table = pa.table({c: pa.array(data[c], type=types[c]) for c in cols})
        table = table.replace_schema_metadata({b"capbench": json.dumps({"source": SOURCE, "pending": pending})
                                               .encode()})
        path = out_dir / f"{name}.parquet"
        pq.write_table(table, path)
        written.append(path)
    return written


INTS = {"heads", "kv_heads", "batch", "length", "hidden", "inter", "experts", "topk", "moe_tp", "moe_ep", "tokens",
        "pool_tokens"}
