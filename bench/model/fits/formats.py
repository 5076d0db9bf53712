"""Routed-expert weight formats (data/expert_formats.yaml): bytes per weight, the SGLang 0.5.23 kernel of each GPU
architecture, where a checkpoint comes from, and the published accuracy per model family.

A format is *served* on a GPU when SGLang 0.5.23 has a kernel for it on the GPU's arch that capbench plans with
(not NF4's dequantise-everything path) and the model's architecture loads it; it is *obtainable* for a model when
the model ships in it, a published checkpoint has it, or `capbench quantize-experts` makes it. The planner searches
only formats that are both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import yaml
from pydantic import BaseModel

from bench.errors import BadInput
from bench.model.fits.catalog import DATA, GPU, Model

Compute = Literal["bf16", "fp8", "wna16", "w4a8", "fp4"]


class Kernel(BaseModel):
    kernel: str
    file: str  # relative to sglang/srt/ in the installed wheel
    compute: Compute
    served: bool = True


class Format(BaseModel):
    name: str
    weight_bits: int
    activations: str
    bytes_per_weight: float
    scales: str
    group_along_intermediate: int | None = None
    needs_calibration: str | None = None
    loads_only: list[str] | None = None
    why_not_loaded: str | None = None
    not_served: str | None = None
    kernels: dict[str, Kernel]


class Conversion(BaseModel):
    flag: str
    from_: list[str]

    model_config = {"populate_by_name": True}


class Checkpoint(BaseModel):
    hf: str
    publisher: str
    weights: str
    quant: str
    source: str


class Catalog(BaseModel):
    sglang: str
    archs: list[str]
    formats: dict[str, Format]
    conversions: dict[str, Conversion]
    checkpoints: dict[str, dict[str, list[Checkpoint]]]
    families: dict[str, list[str]]
    accuracy: dict[str, dict[str, str]]


@cache
def catalog() -> Catalog:
    raw = yaml.safe_load((DATA / "expert_formats.yaml").read_text())
    raw["conversions"] = {k: {"flag": v["flag"], "from_": v["from"]} for k, v in raw["conversions"].items()}
    return Catalog(**raw)


def names() -> list[str]:
    return list(catalog().formats)


def get(fmt: str) -> Format:
    known = catalog().formats
    if fmt not in known:
        raise BadInput(f"unknown expert format '{fmt}'; valid: {', '.join(known)}")
    return known[fmt]


def bytes_per_weight(fmt: str) -> float:
    return get(fmt).bytes_per_weight


def kernel(fmt: str, arch: str | None) -> Kernel | None:
    """SGLang 0.5.23's kernel for the format on this arch, or None where it has none."""
    return get(fmt).kernels.get(arch or "")


def compute(fmt: str, arch: str | None) -> Compute:
    """How the expert GEMMs of this format are priced on this arch (an arch without an entry: as on Hopper)."""
    k = kernel(fmt, arch) or kernel(fmt, "sm90") or next(iter(get(fmt).kernels.values()))
    return k.compute


def group_along_intermediate(fmt: str) -> int | None:
    """Columns of a scale group along the expert intermediate dimension: each MoE rank must hold whole groups."""
    return get(fmt).group_along_intermediate


def family(model_id: str) -> str | None:
    return next((f for f, members in catalog().families.items() if model_id in members), None)


def accuracy(model_id: str, fmt: str) -> str:
    fam = family(model_id)
    return catalog().accuracy.get(fam or "", {}).get(fmt, "none published")


@dataclass(frozen=True)
class Source:
    """Where a checkpoint of a model in an expert format comes from."""

    kind: Literal["native", "shipped", "capbench"]
    weights: str  # the --weights the capacity model prices it as
    hf: str | None = None
    publisher: str | None = None
    detail: str = ""

    def short(self) -> str:
        if self.kind == "capbench":
            return "capbench quantize-experts"
        return self.hf or "-"

    def describe(self) -> str:
        if self.kind == "native":
            return f"{self.hf} (as shipped by {self.publisher})"
        if self.kind == "shipped":
            return f"{self.hf} ({self.publisher})"
        return f"capbench conversion: {self.detail}"


def native_format(model: Model) -> str:
    return model.native_weights.experts


def sources(model: Model, fmt: str) -> list[Source]:
    """Every way to get the model with its routed experts in `fmt`, the vendor's own first."""
    get(fmt)
    out: list[Source] = []
    if native_format(model) == fmt:
        out.append(Source("native", "native", model.hf_repo, model.hf_repo.split("/")[0]))
    for c in catalog().checkpoints.get(model.id, {}).get(fmt, []):
        out.append(Source("shipped", c.weights, c.hf, c.publisher, c.source))
    conv = catalog().conversions.get(fmt)
    if conv and native_format(model) in conv.from_ and native_format(model) != fmt and loads(model, fmt):
        out.append(Source("capbench", fmt, detail=f"capbench quantize-experts --format {conv.flag} --in "
                                                   f"<{model.hf_repo} download> --out ./{model.id}-{fmt}"))
    return out


def obtain(model: Model, fmt: str) -> Source | None:
    """The way the plan uses: the vendor's, else a published checkpoint, else capbench's conversion; None if none."""
    found = sources(model, fmt)
    return found[0] if found else None


def loads(model: Model, fmt: str) -> bool:
    only = get(fmt).loads_only
    return only is None or model.architecture in only


def verdict(model: Model, gpu: GPU, fmt: str) -> tuple[str, str | None]:
    """("searched", None), or (why not in two words, why in a sentence): not served, no kernel, not loaded,
    not obtainable."""
    f, k = get(fmt), kernel(fmt, gpu.arch)
    if f.not_served:
        return "not served", f"not served: {f.not_served}"
    if k is None:
        return "no kernel", f"no SGLang {catalog().sglang} kernel for {f.name} on {gpu.arch or 'this GPU'}"
    if not k.served:
        return "not served", f"not served on {gpu.arch}: {k.kernel}"
    if not loads(model, fmt):
        return "not loaded", f"SGLang {catalog().sglang} does not load it for {model.architecture}: {f.why_not_loaded}"
    if obtain(model, fmt) is None:
        why = f"; a conversion needs {f.needs_calibration}" if f.needs_calibration else ""
        return "not obtainable", (f"not obtainable: no published {model.id} checkpoint in {f.name} and capbench does "
                                  f"not make it{why}")
    return "searched", None


def why_not_served(model: Model, gpu: GPU, fmt: str) -> str | None:
    """Why the planner does not search this format for this model on this GPU, or None when it does."""
    return verdict(model, gpu, fmt)[1]


RANK = {"native": 0, "shipped": 1, "capbench": 2}


def searched(model: Model, gpu: GPU) -> list[str]:
    """The --weights values the planner searches for this model on this GPU: one per served, obtainable format;
    of formats the GPU runs alike (same bytes per weight, same kernel class) only the best-sourced one (the
    vendor's, else a published checkpoint, else capbench's conversion), since they price the same."""
    best: dict[tuple[float, str], tuple[int, str]] = {}
    for fmt in names():
        if why_not_served(model, gpu, fmt) is None:
            src, key = obtain(model, fmt), (bytes_per_weight(fmt), compute(fmt, gpu.arch))
            if key not in best or RANK[src.kind] < best[key][0]:
                best[key] = (RANK[src.kind], src.weights)
    return sorted({w for _, w in best.values()}, key=lambda w: (w != "native", w))


def weights_format(model: Model, weights: str) -> str:
    """The expert format a --weights value runs."""
    if weights == "native":
        return native_format(model)
    if weights == "fp8":
        return "fp8-block128"
    return get(weights) and weights


def source_of(model: Model, weights: str) -> Source | None:
    """The checkpoint a planned --weights value is served from (None: nowhere to get it)."""
    fmt = weights_format(model, weights)
    return next((s for s in sources(model, fmt) if s.weights == weights or s.kind == "native"), None)
