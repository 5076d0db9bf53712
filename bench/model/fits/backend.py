"""SGLang 0.5.23's attention backends as data/attention_backends.yaml gives them: the one SGLang picks when no
--attention-backend is given, the ones that keep capbench's calibrated FP8 KV scales right, and the one a launch
line names. The launcher (engine_patches/launch.py) reads the same file, so a plan never prints a line it refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import yaml

from bench.errors import BadInput
from bench.model.fits.catalog import DATA, GPU, Model

SCALED_KV = ("fp8_e4m3",)  # the KV dtypes SGLang loads per-layer scales for (and capbench calibrates)


@dataclass(frozen=True)
class Backend:
    name: str
    archs: tuple[str, ...]
    kinds: tuple[str, ...]
    scales: dict[str, str]  # kind -> native | patched | refused
    why: dict[str, str]
    fp8_mla_read: str | None = None  # "upcast": the whole FP8 layer is cast to BF16 each step
    page_size: int | None = None  # the page size SGLang forces for this backend


@cache
def _doc() -> dict:
    return yaml.safe_load((DATA / "attention_backends.yaml").read_text())


@cache
def backends() -> dict[str, Backend]:
    out = {}
    for name, b in _doc()["backends"].items():
        out[name] = Backend(name, tuple(b["archs"]), tuple(b["kinds"]), dict(b["scales"]), dict(b.get("why", {})),
                            b.get("fp8_mla_read"), b.get("page_size"))
    return out


def backend(name: str) -> Backend:
    try:
        return backends()[name]
    except KeyError:
        raise BadInput(f"unknown attention backend {name!r}; SGLang 0.5.23's for these models: "
                       f"{', '.join(backends())}") from None


def default_backend(model: Model, gpu: GPU, tp: int = 8) -> str:
    """The backend SGLang 0.5.23 picks for this model on this GPU when none is named (no speculative decoding)."""
    return default_for(model.attention, gpu.arch, model.architecture, max(1, model.kv_heads // tp))


def default_for(kind: str, arch: str | None, architecture: str | None = None, kv_heads_per_rank: int = 1) -> str:
    """The first row of the file's `defaults` whose conditions hold (its last row per kind has none)."""
    for row in _doc()["defaults"]:
        if row["kind"] != kind:
            continue
        if "arch" in row and row["arch"] != arch:
            continue
        if "architectures" in row and architecture not in row["architectures"]:
            continue
        if "kv_heads_per_rank" in row and kv_heads_per_rank not in row["kv_heads_per_rank"]:
            continue
        return row["backend"]
    raise BadInput(f"no SGLang default attention backend for {kind!r} attention")


def runs_on(b: Backend, model: Model, gpu: GPU) -> bool:
    """A GPU of unknown arch (a user's catalog entry without `arch:`) gets Triton, SGLang's portable fallback."""
    return model.attention in b.kinds and (gpu.arch in b.archs if gpu.arch else b.name == "triton")


def keeps_scales(b: Backend, kind: str) -> bool:
    return b.scales.get(kind, "refused") != "refused"


def candidates(model: Model, gpu: GPU, kv_dtype: str) -> list[str]:
    """The backends that run this model on this GPU and, for a scaled FP8 KV cache, keep the scales right."""
    scaled = kv_dtype in SCALED_KV
    return [b.name for b in backends().values()
            if runs_on(b, model, gpu) and (not scaled or keeps_scales(b, model.attention))]


def launch_backend(model: Model, gpu: GPU, kv_dtype: str, tp: int = 8) -> str:
    """The backend a launch line names: SGLang's default where it is a candidate, except that an FP8 MLA cache
    avoids a backend that upcasts the whole layer each step when one that reads FP8 natively runs here."""
    default = default_backend(model, gpu, tp)
    options = candidates(model, gpu, kv_dtype)
    if not options:
        raise BadInput(f"no SGLang 0.5.23 attention backend runs {model.id} on {gpu.id} with {kv_dtype} KV")
    fp8_mla = kv_dtype.startswith("fp8") and model.attention == "mla"
    native = [n for n in options if not (fp8_mla and backends()[n].fp8_mla_read == "upcast")]
    preferred = native or options
    return default if default in preferred else preferred[0]


def refusal(name: str, kind: str, arch: str | None) -> str | None:
    """Why a backend cannot serve calibrated FP8 KV scales for this kind on this arch, naming those that can;
    None when it can."""
    b = backend(name)
    if keeps_scales(b, kind) and kind in b.kinds:
        return None
    working = [x.name for x in backends().values() if kind in x.kinds and keeps_scales(x, kind)
               and (arch is None or arch in x.archs)]
    return (f"--kv-scales with --attention-backend {name} ({kind}) would give wrong attention: "
            f"{b.why.get(kind, 'not an SGLang backend for this attention kind')}; "
            f"use one of: {', '.join(working)}")
