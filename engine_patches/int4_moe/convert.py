"""`capbench quantize-int4`: routed-expert weights of a GLM-4.x / Kimi K2 safetensors checkpoint to INT4 W4A16.

Output: compressed-tensors `pack-quantized`, int4, symmetric, group-wise (32 or 128), the layout Kimi K2 Thinking
ships and SGLang loads with its WNA16 MoE schemes (Marlin, or Triton with `--moe-runner-backend triton`). Each
routed expert projection `...mlp.experts.E.{gate,up,down}_proj.weight` becomes `weight_packed` (int32, 8 values a
word), `weight_scale` (bf16, one per group) and `weight_shape`. Everything else stays as it was: attention, shared
experts, dense MLPs, router, embeddings, lm_head (the config's ignore list says so).

FP8 block-128 input (weight + weight_scale_inv): experts are dequantized and then quantized to INT4; the other FP8
weights are dequantized to BF16, as in Kimi K2 Thinking, because one compressed-tensors config cannot also describe
DeepSeek-style `weight_scale_inv` blocks. Work goes shard by shard: one input shard (plus single tensors read from
other shards when a scale lives elsewhere) is in memory at a time.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from safetensors import safe_open
from safetensors.torch import save_file

EXPERT_WEIGHT = re.compile(r"^(?P<module>.*\bmlp\.experts\.\d+\.(?:gate|up|down)_proj)\.weight$")
LAYER_NUMBER = re.compile(r"\blayers\.(\d+)\.")
FP8_BLOCK = 128
INDEX = "model.safetensors.index.json"
# Kimi K2 Thinking's ignore list, plus the router and GLM's MTP projections (never quantized here either)
IGNORE = ["lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
          r"re:.*mlp\.gate$", r"re:.*eh_proj.*", r"re:.*shared_head.*"]


def quant_args(group_size: int):
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size,
                            dynamic=False, observer="minmax")


def quantization_config(group_size: int) -> dict:
    """The config.json block SGLang's CompressedTensorsConfig reads, built by compressed-tensors itself."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], weights=quant_args(group_size))
    config = QuantizationConfig(config_groups={"group_0": scheme}, quant_method="compressed-tensors",
                                format="pack-quantized", quantization_status="compressed", ignore=IGNORE)
    return config.model_dump(mode="json")


def dequant_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """DeepSeek-style FP8: one fp32 multiplier per 128x128 block."""
    rows, cols = weight.shape
    s = scale_inv.float().repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return weight.float() * s


def bf16_round_up(x: torch.Tensor) -> torch.Tensor:
    """Positive fp32 scales to bf16, never downwards: a scale rounded down would push a group's max past +7.5
    steps, where the symmetric INT4 grid (-8..7) clamps it by more than half a step."""
    y = x.to(torch.bfloat16)
    up = (y.view(torch.int16) + 1).view(torch.bfloat16)
    return torch.where(y.float() < x, up, y)


def quantize_expert(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], float, float]:
    """Pack one expert projection with compressed-tensors; returns its tensors, squared error and squared norm."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    args = quant_args(group_size)
    w = weight.float()
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"expert weight of shape {tuple(w.shape)}: in_features must be a multiple of {group_size}")
    scale, zp = compute_dynamic_scales_and_zp(w, args, module=None)
    scale = bf16_round_up(scale).float()  # stored as bf16: quantize against the value that will be read
    packed = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp},
                                                   QuantizationScheme(targets=["Linear"], weights=args))
    err = fake_quantize(w, scale, zp, args) - w
    return ({"weight_packed": packed["weight_packed"], "weight_scale": scale.to(torch.bfloat16),
             "weight_shape": packed["weight_shape"]}, float(err.square().sum()), float(w.square().sum()))


@dataclass
class LayerError:
    tensors: int = 0
    err_sq: float = 0.0
    norm_sq: float = 0.0
    worst: float = 0.0  # the worst single expert projection's relative error

    def add(self, err_sq: float, norm_sq: float) -> None:
        self.tensors += 1
        self.err_sq += err_sq
        self.norm_sq += norm_sq
        self.worst = max(self.worst, (err_sq / norm_sq) ** 0.5 if norm_sq else 0.0)

    @property
    def rel_err(self) -> float:
        return (self.err_sq / self.norm_sq) ** 0.5 if self.norm_sq else 0.0


@dataclass
class ConversionReport:
    group_size: int
    source_format: str
    shards: int = 0
    expert_tensors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    layers: dict[int, LayerError] = field(default_factory=lambda: defaultdict(LayerError))

    def to_json(self) -> dict:
        total = LayerError()
        for e in self.layers.values():
            total.err_sq, total.norm_sq = total.err_sq + e.err_sq, total.norm_sq + e.norm_sq
        return {"group_size": self.group_size, "source_format": self.source_format, "shards": self.shards,
                "expert_tensors": self.expert_tensors, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "overall_rel_err": total.rel_err,
                "layers": {str(n): {"expert_tensors": e.tensors, "rel_err": e.rel_err, "worst_rel_err": e.worst}
                           for n, e in sorted(self.layers.items())}}


class Checkpoint:
    """Tensor names -> shard files of a safetensors checkpoint directory, with lazily opened shards."""

    def __init__(self, root: Path):
        self.root = root
        index = root / INDEX
        if index.is_file():
            self.weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        else:
            self.weight_map = {}
            for shard in sorted(root.glob("*.safetensors")):
                with safe_open(shard, "pt") as f:
                    self.weight_map.update({name: shard.name for name in f.keys()})
        if not self.weight_map:
            raise ValueError(f"no safetensors weights in {root}")
        self.has_index = index.is_file()
        self._open: dict[str, object] = {}

    @property
    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()))

    def tensor(self, name: str) -> torch.Tensor:
        shard = self.weight_map[name]
        if shard not in self._open:
            self._open[shard] = safe_open(self.root / shard, "pt")
        return self._open[shard].get_tensor(name)

    def release(self) -> None:
        self._open.clear()


def _check_dirs(src: Path, dst: Path, group_size: int) -> None:
    if group_size not in (32, 128):
        raise ValueError(f"--group-size must be 32 or 128 (what SGLang's WNA16 MoE kernels take), got {group_size}")
    if not (src / "config.json").is_file():
        raise ValueError(f"{src} is not a checkpoint directory (no config.json)")
    if dst.resolve() == src.resolve():
        raise ValueError("--out must differ from --in")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not empty; choose a new directory")


def convert(src: str | Path, dst: str | Path, group_size: int = 32, show_progress: bool = True) -> ConversionReport:
    src, dst = Path(src), Path(dst)
    _check_dirs(src, dst, group_size)
    quant_args(group_size)  # import compressed-tensors now: fail before anything is written
    ckpt = Checkpoint(src)
    names = ckpt.weight_map
    experts = [n for n in names if EXPERT_WEIGHT.match(n)]
    if not experts:
        raise ValueError(f"no routed-expert weights (*.mlp.experts.N.(gate|up|down)_proj.weight) in {src}")
    fp8 = any(n.endswith(".weight_scale_inv") for n in names)
    report = ConversionReport(group_size, "fp8-block128" if fp8 else "bf16")
    dst.mkdir(parents=True, exist_ok=True)
    new_map: dict[str, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("int4 experts", total=len(names))
        for shard in ckpt.shards:
            progress.update(task, description=f"int4 {shard}")
            out: dict[str, torch.Tensor] = {}
            for name in [n for n, s in names.items() if s == shard]:
                progress.advance(task)
                if name.endswith(".weight_scale_inv"):
                    continue  # consumed with its weight
                tensor = ckpt.tensor(name)
                report.bytes_in += tensor.numel() * tensor.element_size()
                scale_name = name[: -len("weight")] + "weight_scale_inv"
                if name.endswith(".weight") and scale_name in names:
                    scale_inv = ckpt.tensor(scale_name)
                    report.bytes_in += scale_inv.numel() * scale_inv.element_size()
                    tensor = dequant_fp8_block(tensor, scale_inv)
                    if not EXPERT_WEIGHT.match(name):
                        tensor = tensor.to(torch.bfloat16)
                match = EXPERT_WEIGHT.match(name)
                if match:
                    packed, err_sq, norm_sq = quantize_expert(tensor, group_size)
                    layer = LAYER_NUMBER.search(name)
                    report.layers[int(layer.group(1)) if layer else -1].add(err_sq, norm_sq)
                    report.expert_tensors += 1
                    out.update({f"{match['module']}.{k}": v for k, v in packed.items()})
                else:
                    out[name] = tensor
            save_file({k: v.contiguous() for k, v in out.items()}, dst / shard, metadata={"format": "pt"})
            report.bytes_out += sum(v.numel() * v.element_size() for v in out.values())
            new_map.update({k: shard for k in out})
            report.shards += 1
            ckpt.release()
    _write_metadata(src, dst, ckpt, new_map, report, group_size)
    return report


def _write_metadata(src: Path, dst: Path, ckpt: Checkpoint, new_map: dict, report: ConversionReport, g: int) -> None:
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(g)  # replaces an FP8 block config: those weights are bf16 now
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if ckpt.has_index:
        index = {"metadata": {"total_size": report.bytes_out}, "weight_map": dict(sorted(new_map.items()))}
        (dst / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    for item in src.iterdir():
        if item.suffix == ".safetensors" or item.name in (INDEX, "config.json"):
            continue
        if item.is_dir():
            shutil.copytree(item, dst / item.name)
        else:
            shutil.copy2(item, dst / item.name)
    (dst / "int4_report.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")


def print_report(report: ConversionReport, dst: str | Path) -> None:
    from rich.console import Console
    from rich.table import Table

    data = report.to_json()
    table = Table(title=f"INT4 W4A16 g{report.group_size} routed experts: relative error per layer")
    for col in ("layer", "expert tensors", "rel. error", "worst tensor"):
        table.add_column(col, justify="right")
    for layer, e in data["layers"].items():
        table.add_row(layer, str(e["expert_tensors"]), f"{e['rel_err']:.4f}", f"{e['worst_rel_err']:.4f}")
    console = Console()
    console.print(table)
    console.print(f"source {report.source_format}, {report.shards} shards, {report.expert_tensors} expert tensors; "
                  f"overall relative error {data['overall_rel_err']:.4f}; "
                  f"{report.bytes_in / 2**30:.2f} GiB -> {report.bytes_out / 2**30:.2f} GiB")
    console.print(f"wrote {dst} (report: {Path(dst) / 'int4_report.json'})")
