"""What a conversion did: the relative error of the stored expert weights against the input's values, per layer
and overall, the bytes in and out, the time; written to OUT/int4_report.json and printed as a table."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPORT = "int4_report.json"


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

    def merge(self, other: dict) -> None:
        self.tensors += other["tensors"]
        self.err_sq += other["err_sq"]
        self.norm_sq += other["norm_sq"]
        self.worst = max(self.worst, other["worst"])

    @property
    def rel_err(self) -> float:
        return (self.err_sq / self.norm_sq) ** 0.5 if self.norm_sq else 0.0


@dataclass
class ConversionReport:
    group_size: int
    source_format: str
    format: str = ""
    shards: int = 0
    resumed_shards: int = 0
    expert_tensors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    bytes_read: int = 0  # shard bytes converted by this run (not the resumed ones)
    workers: int = 1
    layers: dict[int, LayerError] = field(default_factory=lambda: defaultdict(LayerError))

    def add_shard(self, record: dict) -> None:
        self.shards += 1
        self.expert_tensors += record["expert_tensors"]
        self.bytes_in += record["bytes_in"]
        self.bytes_out += record["bytes_out"]
        for layer, e in record["layers"].items():
            self.layers[int(layer)].merge(e)

    def to_json(self) -> dict:
        total = LayerError()
        for e in self.layers.values():
            total.err_sq, total.norm_sq = total.err_sq + e.err_sq, total.norm_sq + e.norm_sq
        return {"format": self.format, "group_size": self.group_size, "source_format": self.source_format,
                "shards": self.shards,
                "resumed_shards": self.resumed_shards, "expert_tensors": self.expert_tensors,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "seconds": round(self.seconds, 3),
                "bytes_read": self.bytes_read, "workers": self.workers, "overall_rel_err": total.rel_err,
                "layers": {str(n): {"expert_tensors": e.tensors, "rel_err": e.rel_err, "worst_rel_err": e.worst}
                           for n, e in sorted(self.layers.items())}}


def print_report(report: ConversionReport, dst: str | Path) -> None:
    from rich.console import Console
    from rich.table import Table

    data = report.to_json()
    from engine_patches.int4_moe.schemes import scheme

    title = scheme(report.format).title if report.format else f"INT4 W4A16 g{report.group_size}"
    table = Table(title=f"{title} routed experts: relative error per layer")
    for col in ("layer", "expert tensors", "rel. error", "worst tensor"):
        table.add_column(col, justify="right")
    for layer, e in data["layers"].items():
        table.add_row(layer, str(e["expert_tensors"]), f"{e['rel_err']:.4f}", f"{e['worst_rel_err']:.4f}")
    console = Console()
    console.print(table)
    rate = report.bytes_read / report.seconds / 1e9 if report.seconds else 0.0
    console.print(f"source {report.source_format}, {report.shards} shards ({report.resumed_shards} resumed), "
                  f"{report.expert_tensors} expert tensors; overall relative error {data['overall_rel_err']:.4f}; "
                  f"{report.bytes_in / 2**30:.2f} GiB -> {report.bytes_out / 2**30:.2f} GiB; "
                  f"{report.workers} workers, {report.seconds:.1f} s ({rate:.3f} GB/s this run)")
    console.print(f"wrote {dst} (report: {Path(dst) / REPORT})")
