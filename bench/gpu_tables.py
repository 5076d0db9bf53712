"""A `capbench gpu-check` run's figures added to the kernel tables the performance model reads (data/kernels/: see its
README for the columns), so a lent GPU's run becomes data with one command: `capbench gpu-check-merge RUN.json`.

- attention.parquet and moe.parquet: the run's rows in the tables' own columns, replacing any earlier rows of the same
  GPU, SGLang version and series (a newer run of the same card and version supersedes the older);
- sources.yaml: one entry per operator for (GPU, SGLang version) naming the run (device, versions, when, the command),
  so the loader finds the version (its `versions` list) and the answer can say where its figures came from;
- gpu_check/<gpu>-sglang<version>-<table>.parquet: the run's rows with their provenance columns (device, torch,
  triton, measured_at, source, timing, and pool_tokens for attention), kept so a rebuild of data/kernels from
  AIConfigurator can merge them again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from bench.errors import BadInput

ATTENTION = ["gpu", "sglang", "attention", "phase", "kernel", "backend", "kv_dtype", "heads", "kv_heads", "batch",
             "length", "latency_ms"]
MOE = ["gpu", "sglang", "kernel", "dtype", "format", "hidden", "inter", "experts", "topk", "moe_tp", "moe_ep",
       "distribution", "tokens", "latency_ms"]
COLUMNS = {"attention": ATTENTION, "moe": MOE}
STRINGS = {"gpu", "sglang", "attention", "phase", "kernel", "backend", "kv_dtype", "dtype", "format", "distribution",
           "device", "torch", "triton", "measured_at", "source", "timing"}


def read_run(path: Path) -> dict:
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a gpu-check JSON file ({e})") from None
    if "kernel_tables" not in run:
        raise BadInput(f"{path}: no kernel_tables in it (written by a gpu-check older than the kernel tables)")
    if run.get("pending"):
        raise BadInput(f"{path}: a --quick run on the CPU (pending): its latencies are not GPU figures")
    if not run["kernel_tables"]["attention"] and not run["kernel_tables"]["moe"]:
        raise BadInput(f"{path}: the run timed nothing")
    return run


def _table(rows: list[dict], columns: list[str]) -> pa.Table:
    def kind(c: str):
        return pa.string() if c in STRINGS else pa.float32() if c == "latency_ms" else pa.int32()

    return pa.table({c: pa.array([r.get(c) for r in rows], type=kind(c)) for c in columns})


def _series(name: str, rows: list[dict]) -> dict[str, int]:
    """The AIConfigurator table stems (sources.yaml `tables`) the rows belong to, with their counts."""
    if name == "moe":
        return {"moe": len(rows)}
    out: dict[str, int] = {}
    for r in rows:
        stem = "generation_mla" if r["attention"] == "mla" else "generation_attention"
        out[stem] = out.get(stem, 0) + 1
    return out


def merge(run_path: Path, kernels: Path) -> dict[str, int]:
    """Merge the run into the tables in `kernels`; returns rows written per table."""
    run = read_run(run_path)
    kernels.mkdir(parents=True, exist_ok=True)
    sources_path = kernels / "sources.yaml"
    sources = yaml.safe_load(sources_path.read_text()) if sources_path.is_file() else {}
    sources.setdefault("versions", [])
    sources.setdefault("files", {})
    written = {}
    for name, rows in run["kernel_tables"].items():
        if not rows:
            continue
        gpu, version = rows[0]["gpu"], rows[0]["sglang"]
        path = kernels / f"{name}.parquet"
        new = _table(rows, COLUMNS[name])
        if path.is_file():
            old = pq.read_table(path)
            same = pc.and_(pc.equal(old["gpu"], gpu), pc.equal(old["sglang"], version))
            old = old.filter(pc.invert(same)).select(COLUMNS[name]).cast(new.schema)
            new = pa.concat_tables([old, new])
        pq.write_table(new, path, compression="zstd")
        keep = kernels / "gpu_check" / f"{gpu}-sglang{version}-{name}.parquet"
        keep.parent.mkdir(exist_ok=True)
        cols = list(rows[0])
        pq.write_table(_table(rows, cols), keep)
        op = "moe" if name == "moe" else "attention"
        sources["versions"] = [v for v in sources["versions"]
                               if not (v.get("gpu") == gpu and v.get("sglang") == version and v.get("op") == op)]
        sources["versions"].append({
            "gpu": gpu, "op": op, "sglang": version, "directory": f"data/kernels/{keep.relative_to(kernels)}",
            "measured_by": {"command": "capbench gpu-check", "device": run["device"], "versions": run["versions"],
                            "measured_at": run["measured_at"], "run": str(run_path)},
            "tables": {stem: {"path": f"data/kernels/{keep.relative_to(kernels)}", "rows_read": n, "rows_kept": n}
                       for stem, n in _series(name, rows).items()}})
        sources["files"][f"{name}.parquet"] = new.num_rows
        written[name] = len(rows)
    sources_path.write_text(yaml.safe_dump(sources, sort_keys=False, width=120))
    return written
