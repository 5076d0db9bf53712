"""`capbench quantize-experts` (and `quantize-int4`, its INT4 path): the routed-expert weights of a GLM-4.x / Kimi K2
safetensors checkpoint to another expert format SGLang 0.5.23 loads (schemes.py says which and how).

INT4 output: compressed-tensors `pack-quantized`, int4, symmetric, group-wise (32 or 128; pack.py has the layout),
which SGLang loads with its WNA16 MoE schemes (Marlin, or Triton with `--moe-runner-backend triton`). Each routed
expert projection `...mlp.experts.E.{gate,up,down}_proj.weight` becomes `weight_packed`, `weight_scale` and
`weight_shape`. FP8 block-128 output: `weight` + `weight_scale_inv`; NVFP4: `weight_packed`, `weight_scale`,
`weight_global_scale` (pack_float.py). Everything else stays as it was: attention, shared experts, dense MLPs,
router, embeddings, lm_head.
Input: BF16; FP8 block-128 (weight + weight_scale_inv): experts are dequantized, then quantized, and the other FP8
weights become BF16, as in Kimi K2 Thinking, because one config cannot describe both; INT4 pack-quantized (Kimi K2
Thinking): experts are unpacked to their exact values in fp32 and quantized again, so the output carries the INT4
grid's error plus the new format's rounding of it (the report's error is against the unpacked INT4 values).

How it is safe on a ~700 GB checkpoint:
- everything is checked before any work: the group size against the deployment's tp/ep (layout.py), every
  shard's header against its file size and the index against the shards (shards.py), every expert's shape;
- shards are written into `<out>.partial/` and the directory is renamed to `<out>` at the very end, so an `<out>`
  that exists is complete; each finished shard is fsynced and leaves a record with its size and SHA-256 in
  `<out>.partial/.capbench-int4/` (manifest.py); `--resume` checks every finished shard against its record and
  converts again, saying so, any that differs; before the rename every file is fsynced and every output shard's
  header is read back against its size and the index;
- shards are converted by worker processes in parallel (one input shard in memory per worker).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from engine_patches.int4_moe.layout import GROUP_SIZES, check_group_size
from engine_patches.int4_moe.manifest import fsync_dir, fsync_file, seal_file, shard_problem, write_durably
from engine_patches.int4_moe.report import REPORT, ConversionReport, LayerError, print_report
from engine_patches.int4_moe.schemes import Scheme, check_rows, scheme
from engine_patches.int4_moe.shards import INDEX, Checkpoint

EXPERT_WEIGHT = re.compile(r"^(?P<module>.*\bmlp\.experts\.\d+\.(?:gate|up|down)_proj)\.weight$")
EXPERT_PACKED = re.compile(r"^(?P<module>.*\bmlp\.experts\.\d+\.(?:gate|up|down)_proj)\.weight_packed$")
INT4_PARTS = (".weight_scale", ".weight_shape")  # consumed with an INT4 input expert's weight_packed
LAYER_NUMBER = re.compile(r"\blayers\.(\d+)\.")
STATE = ".capbench-int4"  # inside <out>.partial: the plan and one record per finished shard


@dataclass
class Plan:
    src: Path
    dst: Path
    partial: Path
    group_size: int
    fp8: bool
    checkpoint: Checkpoint
    todo: list[str]  # shards still to convert
    done: dict[str, dict]  # shard -> its record (resumed)
    fmt: str = "int4-g32"
    int4_in: bool = False


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _state(src: Path, group_size: int, ckpt: Checkpoint, fmt: str | None = None) -> dict:
    state = {"src": str(src), "group_size": group_size, "shards": {s.name: s.size for s in ckpt.shards.values()}}
    return state if fmt is None or fmt.startswith("int4") else {**state, "format": fmt}


def _check_experts(ckpt: Checkpoint, group_size: int) -> list[str]:
    experts = [n for n in ckpt.weight_map if EXPERT_WEIGHT.match(n) or EXPERT_PACKED.match(n)]
    if not experts:
        raise ValueError(f"no routed-expert weights (*.mlp.experts.N.(gate|up|down)_proj.weight) in {ckpt.root}")
    for name in experts:
        shape = ckpt.info(name).shape
        if name.endswith("_packed"):  # INT4 pack-quantized: eight int4 per int32
            for part in INT4_PARTS:
                if name.removesuffix("_packed") + part.removeprefix(".weight") not in ckpt.weight_map:
                    raise ValueError(f"{name} is INT4 but the checkpoint has no {name.removesuffix('_packed')}"
                                     f"{part.removeprefix('.weight')}")
            shape = (shape[0], shape[1] * 8)
        if len(shape) != 2 or shape[1] % group_size:
            raise ValueError(f"{name} has shape {list(shape)}: in_features must be a multiple of {group_size}")
        if ckpt.info(name).dtype == "F8_E4M3" and name + "_scale_inv" not in ckpt.weight_map:
            raise ValueError(f"{name} is FP8 but the checkpoint has no {name}_scale_inv")
    return experts


def plan(src: str | Path, dst: str | Path, group_size: int = 32, tp: int = 8, ep: int = 1,
         resume: bool = False, fmt: str | None = None) -> Plan:
    """Every check that can fail, before any work; what is left to do. fmt: a schemes.py flag (default: INT4 at
    group_size)."""
    src, dst = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    partial = dst.with_name(dst.name + ".partial")
    if fmt is None and group_size not in GROUP_SIZES:
        raise ValueError(f"--group-size must be 32 or 128 (what SGLang's WNA16 MoE kernels take), got {group_size}")
    s: Scheme = scheme(fmt or f"int4-g{group_size}")
    if s.flag.startswith("int4"):
        group_size = s.in_group
    if not (src / "config.json").is_file():
        raise ValueError(f"{src} is not a checkpoint directory (no config.json)")
    if _inside(dst, src) or _inside(src, dst):
        raise ValueError(f"--out {dst} must lie outside --in {src} (and the other way round)")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"{dst} exists and is not empty; choose a new directory")
    try:
        config = json.loads((src / "config.json").read_text())
    except ValueError as e:
        raise ValueError(f"{src / 'config.json'}: not JSON ({e})") from None
    text = config.get("text_config") or config
    if "moe_intermediate_size" in text and "hidden_size" in text:
        if s.flag.startswith("int4"):
            check_group_size(group_size, int(text["moe_intermediate_size"]), int(text["hidden_size"]), tp, ep)
        else:
            check_rows(s, int(text["moe_intermediate_size"]), tp, ep)
    ckpt = Checkpoint(src)
    _check_experts(ckpt, s.in_group)
    fp8 = any(n.endswith(".weight_scale_inv") for n in ckpt.weight_map)
    int4_in = any(EXPERT_PACKED.match(n) for n in ckpt.weight_map)
    done: dict[str, dict] = {}
    if partial.exists():
        if not resume:
            raise ValueError(f"{partial} holds an interrupted conversion: add --resume to continue it, "
                             "or delete it to start again")
        state_file = partial / STATE / "plan.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            raise ValueError(f"{partial} is not a capbench conversion (no {STATE}/plan.json); delete it") from None
        if state != _state(src, group_size, ckpt, s.flag):
            raise ValueError(f"{partial} was started from another input or group size, or another format "
                             f"({state.get('src')}, {state.get('format') or 'int4'} g{state.get('group_size')}); "
                             "delete it to start again")
        for shard in ckpt.shards:
            record = partial / STATE / f"{shard}.json"
            if record.is_file() and (partial / shard).is_file():
                done[shard] = json.loads(record.read_text())
    elif resume:
        raise ValueError(f"nothing to resume: {partial} does not exist")
    todo = [s for s in ckpt.shards if s not in done]
    return Plan(src, dst, partial, group_size, fp8, ckpt, todo, done, s.flag, int4_in)


def default_workers(ckpt: Checkpoint, shards: int) -> int:
    """The machine's cores, bounded by memory: a worker holds about two shards' worth (in and out)."""
    cores = os.cpu_count() or 1
    largest = max((s.size for s in ckpt.shards.values()), default=1)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        by_memory = max(1, available // (3 * largest))
    except (ValueError, OSError, AttributeError):
        by_memory = cores
    return max(1, min(cores, by_memory, shards))


def convert_shard(src: str, partial: str, shard: str, weight_map: dict[str, str], fmt: str | int,
                  threads: int) -> dict:
    """Worker process: one input shard -> one output shard (written under a temporary name, then renamed) and its
    record. Returns the record. fmt: a schemes.py flag (an int: INT4 at that group size)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from engine_patches.int4_moe import pack_float
    from engine_patches.int4_moe.pack import dequant_fp8_block, quantize

    flag = f"int4-g{fmt}" if isinstance(fmt, int) else fmt
    torch.set_num_threads(threads)
    src_dir, out_dir = Path(src), Path(partial)
    opened: dict[str, object] = {}

    def tensor(name: str) -> torch.Tensor:
        file = weight_map[name]
        if file not in opened:
            opened[file] = safe_open(src_dir / file, "pt")
        return opened[file].get_tensor(name)

    def full(module: str) -> torch.Tensor:
        """An expert projection's values in fp32, whatever its input format."""
        if module + ".weight_packed" in weight_map:
            return pack_float.dequant_int4(tensor(module + ".weight_packed"), tensor(module + ".weight_scale"),
                                           tensor(module + ".weight_shape"))
        w = tensor(module + ".weight")
        if module + ".weight_scale_inv" in weight_map:
            return dequant_fp8_block(w, tensor(module + ".weight_scale_inv"))
        return w.float()

    def encode(module: str, w: torch.Tensor) -> tuple[dict, float, float]:
        if flag.startswith("int4"):
            return quantize(w, int(flag.removeprefix("int4-g")))
        if flag == "fp8-block128":
            return pack_float.quantize_fp8_block(w)
        partner = {"gate_proj": "up_proj", "up_proj": "gate_proj"}.get(module.rsplit(".", 1)[1])
        amax = float(w.abs().max())
        if partner:  # gate and up of one expert share one NVFP4 global scale (SGLang's W4A16 NVFP4 MoE needs it)
            amax = max(amax, float(full(module.rsplit(".", 1)[0] + "." + partner).abs().max()))
        return pack_float.quantize_nvfp4(w, amax)

    out: dict[str, torch.Tensor] = {}
    layers: dict[int, LayerError] = defaultdict(LayerError)
    experts = bytes_in = 0
    for name in [n for n, s in weight_map.items() if s == shard]:
        if name.endswith(".weight_scale_inv"):
            continue  # consumed with its weight
        packed = EXPERT_PACKED.match(name)
        if not packed and name.endswith(INT4_PARTS) and name.rsplit(".", 1)[0] + ".weight_packed" in weight_map:
            continue  # an INT4 input expert's scale or shape, consumed with its weight_packed
        t = tensor(name)
        bytes_in += t.numel() * t.element_size()
        match = packed or EXPERT_WEIGHT.match(name)
        if match:
            module = match["module"]
            for part in (".weight_scale_inv", *INT4_PARTS):  # its scales (and shape) count as read
                if module + part in weight_map:
                    extra = tensor(module + part)
                    bytes_in += extra.numel() * extra.element_size()
            stored, err_sq, norm_sq = encode(module, full(module))
            layer = LAYER_NUMBER.search(name)
            layers[int(layer.group(1)) if layer else -1].add(err_sq, norm_sq)
            experts += 1
            out.update({f"{module}.{k}": v for k, v in stored.items()})
            continue
        scale_name = name[: -len("weight")] + "weight_scale_inv"
        if name.endswith(".weight") and scale_name in weight_map:
            scale_inv = tensor(scale_name)
            bytes_in += scale_inv.numel() * scale_inv.element_size()
            t = dequant_fp8_block(t, scale_inv).to(torch.bfloat16)
        out[name] = t
    tmp = out_dir / f".{shard}.tmp"
    save_file({k: v.contiguous() for k, v in out.items()}, tmp, metadata={"format": "pt"})
    written = seal_file(tmp, out_dir / shard)
    record = {"shard": shard, **written, "tensors": sorted(out), "expert_tensors": experts, "bytes_in": bytes_in,
              "bytes_out": sum(v.numel() * v.element_size() for v in out.values()),
              "layers": {str(k): {"tensors": e.tensors, "err_sq": e.err_sq, "norm_sq": e.norm_sq, "worst": e.worst}
                         for k, e in layers.items()}}
    write_durably(out_dir / STATE / f"{shard}.json", json.dumps(record))
    return record


def convert(src: str | Path, dst: str | Path, group_size: int = 32, tp: int = 8, ep: int = 1,
            workers: int | None = None, resume: bool = False, show_progress: bool = True,
            fmt: str | None = None) -> ConversionReport:
    import time

    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    p = plan(src, dst, group_size, tp, ep, resume, fmt)
    group_size = p.group_size
    (p.partial / STATE).mkdir(parents=True, exist_ok=True)
    (p.partial / STATE / "plan.json").write_text(json.dumps(_state(p.src, group_size, p.checkpoint, p.fmt)))
    if p.done:
        recheck_finished(p, show_progress)
    source = "int4 (pack-quantized)" if p.int4_in else "fp8-block128" if p.fp8 else "bf16"
    report = ConversionReport(group_size, source, p.fmt, resumed_shards=len(p.done))
    for record in p.done.values():
        report.add_shard(record)
    n_workers = max(1, min(workers or default_workers(p.checkpoint, len(p.todo)), max(1, len(p.todo))))
    report.workers = n_workers
    # OMP_NUM_THREADS, when set, caps each worker's torch threads: on a shared host a thread beyond the free cores
    # spin-waits (an NVFP4 shard of a tiny checkpoint: 5.7 s with two threads on a loaded 2-core host, 0.9 s with one)
    omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    threads = int(omp) if omp.isdigit() and int(omp) > 0 else max(1, (os.cpu_count() or 1) // n_workers)
    sizes = {name: s.size for name, s in p.checkpoint.shards.items()}
    columns = (TextColumn("{task.fields[g]}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TextColumn("{task.fields[shards]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    start = time.monotonic()
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("convert", total=sum(sizes[s] for s in p.todo), g=p.fmt,
                                 shards=f"0/{len(p.todo)} shards ({len(p.done)} resumed), {n_workers} workers")
        finished = 0
        with ProcessPoolExecutor(n_workers, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(convert_shard, str(p.src), str(p.partial), s, p.checkpoint.weight_map,
                                   p.fmt, threads): s for s in p.todo}
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    shard = pending.pop(future)
                    report.add_shard(future.result())
                    finished += 1
                    progress.update(task, advance=sizes[shard],
                                    shards=f"{finished}/{len(p.todo)} shards ({len(p.done)} resumed), "
                                           f"{n_workers} workers")
    report.seconds = time.monotonic() - start
    report.bytes_read = sum(sizes[s] for s in p.todo)
    _finish(p, report)
    return report


def recheck_finished(p: Plan, show_progress: bool = True) -> None:
    """Check every finished shard of a resumed conversion against its record (size, SHA-256, in parallel
    threads: hashlib releases the GIL); one that differs is deleted and converted again, with a line saying so."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.progress import Progress

    with Progress(disable=not show_progress) as progress, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        task = progress.add_task("checking finished shards", total=len(p.done))

        def check(shard: str) -> str | None:
            problem = shard_problem(p.partial / shard, p.done[shard])
            progress.advance(task)
            return problem

        problems = dict(zip(p.done, pool.map(check, list(p.done)), strict=True))
    for shard, problem in problems.items():
        if problem is None:
            continue
        print(f"resume: {shard} cannot be trusted ({problem}); converting it again", flush=True)
        del p.done[shard]
        (p.partial / shard).unlink(missing_ok=True)
        (p.partial / STATE / f"{shard}.json").unlink(missing_ok=True)
    p.todo = [s for s in p.checkpoint.shards if s not in p.done]


def _finish(p: Plan, report: ConversionReport) -> None:
    """Index, config, the source's other files and the report into <out>.partial, then rename it to <out>."""
    from engine_patches.int4_moe.pack import IGNORE, quantization_config
    from engine_patches.int4_moe.pack_float import fp8_block_config, nvfp4_config

    records = [json.loads((p.partial / STATE / f"{s}.json").read_text()) for s in p.checkpoint.shards]
    config = json.loads((p.src / "config.json").read_text())
    quant = {"fp8-block128": fp8_block_config, "nvfp4": lambda: nvfp4_config(IGNORE)}.get(
        p.fmt, lambda: quantization_config(p.group_size))()
    config["quantization_config"] = quant  # replaces the input's FP8 block or INT4 config
    write_durably(p.partial / "config.json", json.dumps(config, indent=2) + "\n")
    if p.checkpoint.has_index:
        weight_map = {t: r["shard"] for r in records for t in r["tensors"]}
        index = {"metadata": {"total_size": sum(r["bytes_out"] for r in records)},
                 "weight_map": dict(sorted(weight_map.items()))}
        write_durably(p.partial / INDEX, json.dumps(index, indent=2) + "\n")
    for item in p.src.iterdir():
        if item.suffix == ".safetensors" or item.name in (INDEX, "config.json"):
            continue
        if item.is_dir():
            shutil.copytree(item, p.partial / item.name, dirs_exist_ok=True)
        else:
            shutil.copy2(item, p.partial / item.name)
    write_durably(p.partial / REPORT, json.dumps(report.to_json(), indent=1) + "\n")
    for tmp in p.partial.glob(".*.tmp"):
        tmp.unlink()  # a shard or record a crash left half-written
    _verify_output(p, records)
    shutil.rmtree(p.partial / STATE)
    for path in [*p.partial.rglob("*"), p.partial]:  # copied files and folders; shards were fsynced when written
        (fsync_dir if path.is_dir() else fsync_file)(path)
    if p.dst.exists():
        p.dst.rmdir()  # empty (plan checked)
    os.replace(p.partial, p.dst)
    fsync_dir(p.dst.parent)


def _verify_output(p: Plan, records: list[dict]) -> None:
    """Every output shard's header read back against its file size, the index against the shards, and every shard
    of the size it was written at: a ValueError naming the shard otherwise, and OUT is not created."""
    out = Checkpoint(p.partial)
    for r in records:
        shard = out.shards.get(r["shard"])
        if shard is None or shard.size != r["file_bytes"] or set(shard.tensors) != set(r["tensors"]):
            raise ValueError(f"{p.partial / r['shard']}: not the shard that was written; run again with --resume")


__all__ = ["ConversionReport", "LayerError", "REPORT", "convert", "plan", "print_report"]
