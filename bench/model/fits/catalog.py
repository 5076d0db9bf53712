"""Model and GPU facts from data/, validated, plus a user's override file.

The override file is `$CAPBENCH_CATALOG` if set, else `~/.config/capbench/catalog.yaml` if it exists. It has
two optional maps, `models:` and `gpus:`; an entry with a known id is merged field by field over the shipped
one, an entry with a new id must be complete.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from bench import files
from bench.checks import INT_MAX
from bench.errors import BadInput

DATA = Path(__file__).resolve().parents[3] / "data"
WeightFormat = Literal["bf16", "fp8-block128", "int4-g32", "int4-g128"]
# sizes, bandwidths and rates a model divides by: zero or negative is a typo, refused with the key named; all finite
# and within what the options take (bench/checks.py)
Pos = Annotated[int, Field(gt=0, le=INT_MAX)]
Count = Annotated[int, Field(ge=0, le=INT_MAX)]
Rate = Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]


class NativeWeights(files.Schema):
    experts: WeightFormat
    rest: WeightFormat


class Model(files.Schema):
    id: str
    name: str
    hf_repo: str
    architecture: str
    attention: Literal["mla", "gqa"]
    layers: Pos
    mtp_layers: Count = 0
    hidden_size: Pos
    dense_intermediate_size: Count
    attention_heads: Pos
    kv_heads: Pos
    head_dim: Pos | None = None
    v_head_dim: Pos
    kv_lora_rank: Pos | None = None
    q_lora_rank: Pos | None = None
    qk_rope_head_dim: Pos | None = None
    qk_nope_head_dim: Pos | None = None
    routed_experts: Pos
    experts_per_token: Pos
    shared_experts: Count
    moe_intermediate_size: Pos
    first_dense_layers: Count
    vocab_size: Pos
    max_context: Pos
    published_params_b: dict[str, Rate]
    native_weights: NativeWeights
    sources: dict[str, files.Text]
    uncertain: list[files.Text] = []

    @property
    def moe_layers(self) -> int:
        return self.layers - self.first_dense_layers


class GPU(files.Schema):
    id: str
    name: str
    vendor: Literal["nvidia", "amd"] = "nvidia"
    arch: Literal["sm80", "sm90", "sm100", "gfx942", "gfx950"] | None = None  # what SGLang's backend choice keys on
    memory_mib_reported: Pos
    memory_gb_sold: Rate
    hbm_tbps: Rate
    bf16_tflops: Rate
    fp8_tflops: NonNeg
    fp4_tflops: NonNeg = 0.0  # dense FP4 tensor-core rate (W4A4 experts); 0: no FP4 tensor cores
    int8_tops: NonNeg
    interconnect_gbps: Rate
    internode_gbps: Rate
    gpus_per_node: Pos
    default_page_size: Pos = 1
    reserved_before_load_gib: NonNeg
    price_per_gpu_hour: NonNeg
    sources: dict[str, files.Text]


def override_path() -> Path | None:
    env = os.environ.get("CAPBENCH_CATALOG")
    if env:
        return Path(env)
    home = Path.home() / ".config" / "capbench" / "catalog.yaml"
    return home if home.exists() else None


def _read_yaml(path: Path) -> dict:
    data = files.read(path, "catalog", "yaml") or {}
    if not isinstance(data, dict):
        raise BadInput(f"catalog file {path}: expected a mapping (models: / gpus:), not a {type(data).__name__}")
    return data


def _entries(extra: dict, section: str, source: object) -> dict[str, dict]:
    """The override file's `models:` or `gpus:` map, each entry a map of fields."""
    entries = extra.get(section) or {}
    if not isinstance(entries, dict):
        raise BadInput(f"{source}: {section}: expected a map of id -> fields, not a {type(entries).__name__}")
    for key, fields in entries.items():
        if fields is not None and not isinstance(fields, dict):
            raise BadInput(f"{source}: {section}.{key}: expected a map of fields, not a {type(fields).__name__}")
    return {str(k): v for k, v in entries.items()}


def _merge(base: dict[str, dict], extra: dict[str, dict] | None) -> dict[str, dict]:
    merged = {k: dict(v) for k, v in base.items()}
    for key, fields in (extra or {}).items():
        merged[key] = {**merged.get(key, {}), **(fields or {}), "id": key}
    return merged


def _build(kind: type[BaseModel], raw: dict[str, dict], source: str, section: str) -> dict:
    out, wrong = {}, []
    for key, fields in raw.items():
        model, problems = files.problems(kind, {"id": key, **fields}, f"{section}.{key}")
        out[key] = model
        wrong += problems
    if wrong:
        raise BadInput("\n".join(f"{source}: {w}" for w in wrong))
    return out


@cache
def _load(override: Path | None) -> tuple[dict[str, Model], dict[str, GPU]]:
    models = {p.stem: _read_yaml(p) for p in sorted((DATA / "models").glob("*.yaml"))}
    gpus = _read_yaml(DATA / "gpus.yaml")
    extra = _read_yaml(override) if override else {}
    source = str(override) if override else "data/"
    unknown = sorted(set(map(str, extra)) - {"models", "gpus"})
    if unknown:
        raise BadInput(f"{source}: unknown section(s) {', '.join(unknown)}; the file has models: and gpus:")
    return (
        _build(Model, _merge(models, _entries(extra, "models", source)), source, "models"),
        _build(GPU, _merge(gpus, _entries(extra, "gpus", source)), source, "gpus"),
    )


def models() -> dict[str, Model]:
    return _load(override_path())[0]


def gpus() -> dict[str, GPU]:
    return _load(override_path())[1]


def model(model_id: str) -> Model:
    known = models()
    if model_id not in known:
        raise BadInput(f"unknown model '{model_id}'; valid: {', '.join(sorted(known))}")
    return known[model_id]


def gpu(gpu_id: str) -> GPU:
    known = gpus()
    if gpu_id not in known:
        raise BadInput(f"unknown GPU '{gpu_id}'; valid: {', '.join(sorted(known))}")
    return known[gpu_id]
