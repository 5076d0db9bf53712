"""A per-layer FP8 KV scales file as a campaign (`kv_scales:`) or `capbench sglang-launch --kv-scales` names it: the
JSON SGLang's `--quantization-param-path` reads (engine_patches/fp8_scales/scales_file.py writes it), checked
before anything launches with bench/files.py: a regular file, JSON, every scale finite and above 0."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from bench import files
from bench.checks import GPUS_MAX
from bench.errors import BadInput

MAX_BYTES = 16 << 20  # one float per layer and rank: a few kB for any model
Scale = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
Rank = Annotated[int, Field(ge=0, lt=GPUS_MAX)]
Layer = Annotated[int, Field(ge=0, le=100_000)]


class KVCache(files.Schema):
    dtype: Literal["float8_e4m3fn", "float8_e5m2"]
    scaling_factor: Annotated[dict[Rank, Annotated[dict[Layer, Scale], Field(min_length=1)]], Field(min_length=1)]


class KVScales(files.Schema):
    """SGLang's QuantParamSchema, and capbench's own section beside it (separate K and V scales, the maxima)."""

    model_type: str | None = None
    kv_cache: KVCache
    capbench: dict[str, Any] | None = None


def check_scales(path: str | Path) -> str | None:
    """What is wrong with a KV scales file, or None (the lines of bench/files.py, joined)."""
    try:
        files.load(KVScales, Path(path).expanduser(), "KV scales", "json", MAX_BYTES)
    except BadInput as e:
        return "; ".join(str(e).splitlines())
    return None
