"""Rebuild data/kernels/ from a checkout of NVIDIA AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0):
its per-operator SGLang latency tables, cut down to the shapes capbench's catalog takes at the parallelisms the
planner searches, in the columns `capbench gpu-check-merge` writes (bench/gpu_tables.py; data/kernels/README.md).

    python -m bench.benchmarks.kernel_tables --checkout PATH [--out data/kernels]

PATH is a work tree, or a bare git directory read at HEAD with `git show`. Only the tables are read, never the
repository's code. The tables are rewritten whole: runs of `capbench gpu-check` kept under data/kernels/gpu_check/ are
merged again afterwards with `capbench gpu-check-merge RUN.json` (the script names them).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench.gpu_tables import ATTENTION, MOE, STRINGS

REPO = "github.com/ai-dynamo/aiconfigurator"
ROOT = "aic-core/src/aiconfigurator_core/systems/data"
GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200", "b300_sxm": "b300"}
GEMM = ["gpu", "sglang", "kernel", "dtype", "format", "m", "n", "k", "latency_ms"]
COMM = ["gpu", "sglang", "op", "kernel", "gpus", "hidden", "topk", "experts", "tokens", "bytes", "sms", "latency_ms",
        "dispatch_ms", "combine_ms"]
COLUMNS = {"attention": ATTENTION, "moe": MOE, "gemm": GEMM, "comm": COMM}
KV = {"bfloat16": "bf16", "fp8": "fp8_e4m3"}
FORMATS = {"bfloat16": "bf16", "fp8_block": "fp8-block128", "fp8": "fp8", "int4_wo": "int4-g32", "nvfp4": "nvfp4",
           "w4a16_mxfp4": "mxfp4-w4a16", "w4a8_mxfp4_mxfp8": "mxfp4-w4a8"}
# The catalog's MoE shapes (hidden, intermediate, experts, top-k) and the nearest measured shapes GLM's borrow
MOE_SHAPES = {(7168, 2048, 256, 8), (7168, 2048, 384, 8), (4096, 1536, 128, 8), (6144, 2560, 160, 8)}
# GQA heads per GPU of GLM-4.x (96 query / 8 KV heads, head_dim 128) at attention TP 1-8
GQA_HEADS = {(96, 8), (48, 4), (24, 2), (12, 1)}
MOE_GPUS = 64  # the largest moe_tp * moe_ep the planner searches


def backend_of(kernel: str, gpu: str) -> str:
    """AIConfigurator's kernel_source as SGLang's --attention-backend: its FlashAttention backend is fa3 on Hopper."""
    if kernel == "flash_attention":
        return "fa3" if gpu in ("h100-sxm", "h200") else "trtllm_mla"
    return kernel


class Checkout:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.bare = not (path / ROOT).is_dir()
        if self.bare:
            self.commit = self._git("rev-parse", "HEAD").decode().strip()
            self.files = self._git("ls-tree", "-r", "--name-only", "HEAD", ROOT).decode().split()
        else:
            self.commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                                         text=True).stdout.strip() or "unknown"
            self.files = [str(p.relative_to(path)) for p in (path / ROOT).rglob("*") if p.is_file()]

    def _git(self, *args: str) -> bytes:
        return subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, check=True).stdout

    def read(self, rel: str) -> bytes:
        return self._git("show", f"HEAD:{rel}") if self.bare else (self.path / rel).read_bytes()

    def tables(self):
        """(gpu, op, version, stem, path) of each SGLang table of the GPUs kept."""
        for f in sorted(self.files):
            parts = f[len(ROOT) + 1:].split("/")
            if len(parts) == 5 and parts[0] in GPUS and parts[2] == "sglang":
                yield parts[0], parts[1], parts[3], parts[4], f


def _attention(df: pd.DataFrame, gpu: str, version: str, stem: str) -> pd.DataFrame:
    mla = stem.endswith("mla_perf")
    phase = "prefill" if stem.startswith("context") else "decode"
    if mla:
        df = df[df["mla_dtype"] == "bfloat16"] if "mla_dtype" in df else df
        heads, kv_heads = df.num_heads, 1
    else:
        window = df.window_size if "window_size" in df else 0
        df = df[(df.get("head_dim", 128) == 128) & (window == 0)]
        pairs = zip(df.num_heads, df.num_key_value_heads, strict=True)
        df = df[pd.Series([p in GQA_HEADS for p in pairs], index=df.index, dtype=bool)]
        heads, kv_heads = df.num_heads, df.num_key_value_heads
    length = df.isl + df.step if phase == "decode" else df.isl
    out = pd.DataFrame({"gpu": gpu, "sglang": version, "attention": "mla" if mla else "gqa", "phase": phase,
                        "kernel": df.kernel_source, "backend": [backend_of(k, gpu) for k in df.kernel_source],
                        "kv_dtype": df.kv_cache_dtype.map(KV), "heads": heads, "kv_heads": kv_heads,
                        "batch": df.batch_size, "length": length, "latency_ms": df.latency,
                        "_attn": df.get("attn_dtype", df.get("mla_dtype"))})
    # an FP8 cache is timed with BF16 and with FP8 attention math where both were run: keep SGLang's BF16 math
    out = out.sort_values("_attn", key=lambda s: s != "bfloat16", kind="stable")
    keys = [c for c in ATTENTION if c not in ("latency_ms", "kernel")]
    return out.drop_duplicates(keys).drop(columns="_attn")


def _moe(df: pd.DataFrame, gpu: str, version: str) -> pd.DataFrame:
    df = df[(df.distribution == "balanced") & (df.moe_tp_size * df.moe_ep_size <= MOE_GPUS)]
    shapes = zip(df.hidden_size, df.inter_size, df.num_experts, df.topk, strict=True)
    df = df[pd.Series([s in MOE_SHAPES for s in shapes], index=df.index, dtype=bool)]
    return pd.DataFrame({"gpu": gpu, "sglang": version, "kernel": df.get("kernel_source", "sglang"),
                         "dtype": df.moe_dtype,
                         "format": df.moe_dtype.map(FORMATS).fillna(df.moe_dtype), "hidden": df.hidden_size,
                         "inter": df.inter_size, "experts": df.num_experts, "topk": df.topk,
                         "moe_tp": df.moe_tp_size, "moe_ep": df.moe_ep_size, "distribution": df.distribution,
                         "tokens": df.num_tokens, "latency_ms": df.latency})


def gemm_shapes() -> set[tuple[int, int]]:
    """(n, k) of every dense GEMM the catalog's models run per GPU at TP 1-8: output width, input depth."""
    from bench.model import catalog

    shapes = set()
    for m in catalog.models().values():
        h = m.hidden_size
        for tp in (1, 2, 4, 8):
            if m.attention == "mla":
                heads = m.attention_heads // tp
                shapes |= {(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, h),
                           (heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank),
                           (h, heads * m.v_head_dim)}
            else:
                shapes |= {((m.attention_heads + 2 * m.kv_heads) // tp * m.head_dim, h),
                           (h, m.attention_heads // tp * m.head_dim)}
            shared = m.moe_intermediate_size * m.shared_experts // tp
            shapes |= {(2 * shared, h), (h, shared), (2 * m.dense_intermediate_size // tp, h),
                       (h, m.dense_intermediate_size // tp), (m.vocab_size // tp, h)}
    return {s for s in shapes if all(s)}


def _bracket(grid: list[int], d: int) -> set[int]:
    below, above = [g for g in grid if g <= d], [g for g in grid if g >= d]
    return ({max(below)} if below else set()) | ({min(above)} if above else set())


def _gemm(df: pd.DataFrame, gpu: str, version: str, shapes: set[tuple[int, int]]) -> pd.DataFrame:
    ns, ks = sorted(df.n.unique()), sorted(df.k.unique())
    corners = {(n, k) for n0, k0 in shapes for n in _bracket(ns, n0) for k in _bracket(ks, k0)}
    keep = pd.Series([nk in corners for nk in zip(df.n, df.k, strict=True)], index=df.index, dtype=bool)
    df = df[keep & ~((df.m > 17) & (df.m % 16 == 1))]  # the m = 16j + 1 tile-edge repeats add nothing here
    return pd.DataFrame({"gpu": gpu, "sglang": version, "kernel": df.get("kernel_source", "sglang"),
                         "dtype": df.gemm_dtype, "format": df.gemm_dtype.map(FORMATS).fillna(df.gemm_dtype),
                         "m": df.m, "n": df.n, "k": df.k, "latency_ms": df.latency})


def _comm(df: pd.DataFrame, gpu: str, version: str, stem: str) -> pd.DataFrame:
    if stem == "custom_allreduce_perf":
        return pd.DataFrame({"gpu": gpu, "sglang": version, "op": "all_reduce", "kernel": df.kernel_source,
                             "gpus": df.num_gpus, "bytes": df.message_size * 2, "latency_ms": df.latency})
    df = df[(df.num_topk == 8) & df.hidden_size.isin([4096, 5120, 6144, 7168])]
    if stem == "wideep_deepep_ll_perf":
        d, c = df.dispatch_avg_t_us / 1e3, df.combine_avg_t_us / 1e3
        op, sms = "deepep_ll", None
    else:
        d = (df.dispatch_transmit_us + df.dispatch_notify_us) / 1e3
        c = (df.combine_transmit_us + df.combine_notify_us) / 1e3
        op, sms = "deepep_normal", df.dispatch_sms
    return pd.DataFrame({"gpu": gpu, "sglang": version, "op": op, "kernel": df.kernel_source, "gpus": df.node_num * 8,
                         "hidden": df.hidden_size, "topk": df.num_topk, "experts": df.num_experts,
                         "tokens": df.num_token, "sms": sms, "dispatch_ms": d, "combine_ms": c, "latency_ms": d + c})


STEMS = {"context_attention_perf": "attention", "generation_attention_perf": "attention",
         "context_mla_perf": "attention", "generation_mla_perf": "attention", "moe_perf": "moe",
         "gemm_perf": "gemm", "custom_allreduce_perf": "comm", "wideep_deepep_ll_perf": "comm",
         "wideep_deepep_normal_perf": "comm"}


def _arrow(df: pd.DataFrame, columns: list[str]) -> pa.Table:
    def kind(c: str):
        if c in STRINGS or c == "op":
            return pa.string()
        return pa.float32() if c.endswith("_ms") else pa.int32()

    cols = {}
    for c in columns:
        s = df[c] if c in df else pd.Series([None] * len(df))
        t = kind(c)
        values = [None if pd.isna(x) else (int(x) if t == pa.int32() else x) for x in s.tolist()]
        cols[c] = pa.array(values, type=t)
    return pa.table(cols)


def build(checkout: Path, out: Path) -> dict[str, int]:
    co = Checkout(checkout)
    shapes = gemm_shapes()
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in COLUMNS}
    versions, notes = [], {}
    for aic_gpu, op, version, name, rel in co.tables():
        gpu = GPUS[aic_gpu]
        folder = f"{ROOT}/{aic_gpu}/{op}/sglang/{version}"
        if name in ("collection_meta.yaml", "reuse.yaml"):
            meta = yaml.safe_load(co.read(rel))
            notes[folder] = {k: v for k, v in meta.items() if k not in ("schema_version",)}
            continue
        stem = name.removesuffix(".parquet")
        table = STEMS.get(stem)
        if table is None:
            continue
        df = pd.read_parquet(io.BytesIO(co.read(rel)))
        if table == "attention":
            kept = _attention(df, gpu, version, stem)
        elif table == "moe":
            kept = _moe(df, gpu, version)
        elif table == "gemm":
            kept = _gemm(df, gpu, version, shapes)
        else:
            kept = _comm(df, gpu, version, stem)
        frames[table].append(kept)
        versions.append({"gpu": gpu, "op": table, "sglang": version, "stem": stem, "path": rel,
                         "rows_read": len(df), "rows_kept": len(kept)})
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, parts in frames.items():
        df = pd.concat(parts, ignore_index=True)
        pq.write_table(_arrow(df, COLUMNS[name]), out / f"{name}.parquet", compression="zstd")
        written[name] = len(df)
    sources = _sources(co, versions, notes, written)
    plain = json.loads(json.dumps(sources))  # no YAML anchors for the shared collection notes
    (out / "sources.yaml").write_text(yaml.safe_dump(plain, sort_keys=False, width=120))
    return written


def _sources(co: Checkout, versions: list[dict], notes: dict, written: dict) -> dict:
    grouped: dict[tuple, dict] = {}
    for v in versions:
        key = (v["gpu"], v["op"], v["sglang"])
        folder = v["path"].rsplit("/", 1)[0]
        entry = grouped.setdefault(key, {"gpu": v["gpu"], "op": v["op"], "sglang": v["sglang"], "directory": folder,
                                         "tables": {}})
        meta = notes.get(folder, {})
        collection = {k: w for k, w in meta.items() if k != "tables"}
        collection.update((meta.get("tables") or {}).get(v["stem"], {}))
        entry["tables"][v["stem"]] = {"path": v["path"], "rows_read": v["rows_read"], "rows_kept": v["rows_kept"],
                                      "collection": collection}
    reuse = []
    for folder, meta in notes.items():
        for r in meta.get("reuse", []) or []:
            parts = folder[len(ROOT) + 1:].split("/")
            if parts[0] in GPUS and r["table"] in STEMS:
                reuse.append({"gpu": GPUS[parts[0]], "op": STEMS[r["table"]], "sglang": parts[3], "table": r["table"],
                              "from_version": str(r["from_version"]), "reason": r.get("reason")})
    return {
        "source": {"repository": REPO, "commit": co.commit, "root": ROOT, "licence": "Apache-2.0",
                   "notice": "Copyright (c) 2026 NVIDIA CORPORATION & AFFILIATES (SPDX-License-Identifier: "
                             "Apache-2.0, in each table's collection_meta.yaml); the repository has no NOTICE file. "
                             "Tables cut down and columns renamed by bench/benchmarks/kernel_tables.py.",
                   "read": "per-operator tables only, never the repository's code or prose",
                   "notes": ["latencies are one layer's operator in ms on one GPU, as AIConfigurator's collector "
                             "timed it under SGLang at the version of the folder",
                             "AIConfigurator's 'flash_attention' kernel is SGLang's FlashAttention backend: fa3 on "
                             "Hopper, trtllm_mla on Blackwell",
                             "GLM-4.x's MoE shape (5120 x 1536, 160 experts) was not collected: the nearest measured "
                             "shapes are kept and scaled (bench/model/step/kernels.py says so in its answer)",
                             "the MoE tables' balanced token distribution only; power-law rows were dropped"]},
        "versions": sorted(grouped.values(), key=lambda e: (e["gpu"], e["op"], e["sglang"])),
        "reuse": reuse,
        "files": {f"{name}.parquet": n for name, n in written.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", required=True, type=Path, help="AIConfigurator checkout (work tree or bare git dir)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "data" / "kernels")
    a = p.parse_args(argv)
    if not a.checkout.exists():
        print(f"--checkout {a.checkout}: no such directory", file=sys.stderr)
        return 2
    kept = sorted((a.out / "gpu_check").glob("*.parquet")) if (a.out / "gpu_check").is_dir() else []
    written = build(a.checkout, a.out)
    for name, n in written.items():
        print(f"{name}.parquet: {n} rows, {(a.out / f'{name}.parquet').stat().st_size / 1e6:.2f} MB")
    if kept:
        print(f"{len(kept)} gpu-check tables under {a.out / 'gpu_check'}: merge their runs again with "
              f"`capbench gpu-check-merge RUN.json --kernels {a.out}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
