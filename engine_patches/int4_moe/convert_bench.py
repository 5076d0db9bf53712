"""How fast `capbench quantize-int4` converts, and what that means for GLM-4.6 and Kimi K2.

    python -m engine_patches.int4_moe.convert_bench [--shard-gb 1.0] [--shards 2] [--repeat 1] [--dir DIR]

Writes synthetic shards with the real expert shapes (GLM-4.6 BF16: 1536x5120 and 5120x1536; Kimi K2 FP8
block-128: 2048x7168 and 7168x2048), converts them with 1 worker and with one worker per core, and prints the
input GB/s (shard bytes read / wall time, median of --repeat runs) and the full-model estimates: GLM-4.6 ~714 GB of
BF16, Kimi K2 Instruct ~1,030 GB of FP8. A host with C cores runs min(C, memory / (3 x shard)) workers; the
estimate for such a host multiplies the one-worker rate by its worker count, which holds while the disk keeps up
(it prints the disk rate that would be needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

MODELS = {  # name: (bytes of the whole checkpoint, expert shapes (rows, cols), fp8)
    "glm-4.6": (714e9, ((1536, 5120), (5120, 1536)), False),
    "kimi-k2": (1030e9, ((2048, 7168), (7168, 2048)), True),
}


def synthetic(root: Path, model: str, shard_gb: float, shards: int) -> int:
    _, shapes, fp8 = MODELS[model]
    gen = torch.Generator().manual_seed(0)
    root.mkdir(parents=True)
    weight_map, total = {}, 0
    per_shard = shard_gb * 1e9
    for s in range(shards):
        tensors, size, e = {}, 0, 0
        while size < per_shard:
            for proj, (rows, cols) in zip(("gate_proj", "down_proj"), shapes, strict=True):
                name = f"model.layers.{s + 1}.mlp.experts.{e}.{proj}.weight"
                w = torch.randn(rows, cols, generator=gen) * 0.02
                if fp8:
                    tensors[name] = (w * 448 / 0.1).clamp(-448, 448).to(torch.float8_e4m3fn)
                    tensors[name + "_scale_inv"] = torch.full((math.ceil(rows / 128), math.ceil(cols / 128)), 0.1 / 448)
                else:
                    tensors[name] = w.to(torch.bfloat16)
                size += sum(t.numel() * t.element_size() for k, t in tensors.items() if k.startswith(name))
            e += 1
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, root / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
        total += (root / fname).stat().st_size
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    rows, cols = shapes[0]
    (root / "config.json").write_text(json.dumps({"architectures": ["Synthetic"], "moe_intermediate_size": rows,
                                                  "hidden_size": cols}))
    return total


def run(src: Path, workers: int, repeat: int) -> float:
    from engine_patches.int4_moe.convert import convert

    rates = []
    for i in range(repeat):
        out = src.parent / f"out-{workers}-{i}"
        report = convert(src, out, group_size=32, tp=8, workers=workers, show_progress=False)
        rates.append(report.bytes_read / report.seconds / 1e9)
        shutil.rmtree(out)
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard-gb", type=float, default=1.0)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(dir=a.dir, prefix="int4-bench-"))
    print(f"{cores} cores; {a.shards} shards of ~{a.shard_gb:g} GB per model; scratch {scratch}")
    try:
        for model, (size, _, _) in MODELS.items():
            src = scratch / model / "in"
            written = synthetic(src, model, a.shard_gb, a.shards)
            one = run(src, 1, a.repeat)
            many = run(src, min(cores, a.shards), a.repeat)
            print(f"{model}: {written / 1e9:.2f} GB in; 1 worker {one:.3f} GB/s; {min(cores, a.shards)} workers "
                  f"{many:.3f} GB/s (x{many / one:.2f})")
            for host_cores in (cores, 64):
                workers = host_cores if host_cores != cores else min(cores, a.shards)
                rate = many if host_cores == cores else one * workers
                print(f"  full {model} ({size / 1e9:.0f} GB) on {host_cores} cores ({workers} workers): "
                      f"{size / 1e9 / rate / 3600:.2f} h at {rate:.2f} GB/s (needs the disk to read {rate:.2f} GB/s "
                      f"and write ~{rate * (0.3 if model == 'glm-4.6' else 0.6):.2f} GB/s)")
            shutil.rmtree(scratch / model)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
