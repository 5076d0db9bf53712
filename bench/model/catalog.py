"""Model and GPU facts from data/, validated, plus a user's override file.

The override file is `$CAPBENCH_CATALOG` if set, else `~/.config/capbench/catalog.yaml` if it exists. It has
two optional maps, `models:` and `gpus:`; an entry with a known id is merged field by field over the shipped
one, an entry with a new id must be complete.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError

from bench.errors import BadInput

DATA = Path(__file__).resolve().parents[2] / "data"
WeightFormat = Literal["bf16", "fp8-block128", "int4-g32", "int4-g128"]


class NativeWeights(BaseModel):
    experts: WeightFormat
    rest: WeightFormat


class Model(BaseModel):
    id: str
    name: str
    hf_repo: str
    architecture: str
    attention: Literal["mla", "gqa"]
    layers: int
    mtp_layers: int = 0
    hidden_size: int
    dense_intermediate_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int | None = None
    v_head_dim: int
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    moe_intermediate_size: int
    first_dense_layers: int
    vocab_size: int
    max_context: int
    published_params_b: dict[str, float]
    native_weights: NativeWeights
    sources: dict[str, str]
    uncertain: list[str] = []

    @property
    def moe_layers(self) -> int:
        return self.layers - self.first_dense_layers


class GPU(BaseModel):
    id: str
    name: str
    vendor: Literal["nvidia", "amd"] = "nvidia"
    memory_mib_reported: int
    memory_gb_sold: float
    hbm_tbps: float
    bf16_tflops: float
    fp8_tflops: float
    int8_tops: float
    interconnect_gbps: float
    internode_gbps: float
    gpus_per_node: int
    default_page_size: int = 1
    reserved_before_load_gib: float
    price_per_gpu_hour: float
    sources: dict[str, str]


def override_path() -> Path | None:
    env = os.environ.get("CAPBENCH_CATALOG")
    if env:
        return Path(env)
    home = Path.home() / ".config" / "capbench" / "catalog.yaml"
    return home if home.exists() else None


def _read_yaml(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as e:
        raise BadInput(f"catalog file not found: {path}") from e
    except yaml.YAMLError as e:
        raise BadInput(f"catalog file {path} is not valid YAML: {str(e).splitlines()[0]}") from e


def _merge(base: dict[str, dict], extra: dict[str, dict] | None) -> dict[str, dict]:
    merged = {k: dict(v) for k, v in base.items()}
    for key, fields in (extra or {}).items():
        merged[key] = {**merged.get(key, {}), **(fields or {}), "id": key}
    return merged


def _build(kind: type[BaseModel], raw: dict[str, dict], source: str) -> dict:
    out = {}
    for key, fields in raw.items():
        try:
            out[key] = kind(**{"id": key, **fields})
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise BadInput(f"{source}: {kind.__name__.lower()} '{key}': {where}: {err['msg']}") from e
    return out


@cache
def _load(override: Path | None) -> tuple[dict[str, Model], dict[str, GPU]]:
    models = {p.stem: _read_yaml(p) for p in sorted((DATA / "models").glob("*.yaml"))}
    gpus = _read_yaml(DATA / "gpus.yaml")
    extra = _read_yaml(override) if override else {}
    source = str(override) if override else "data/"
    return (
        _build(Model, _merge(models, extra.get("models")), source),
        _build(GPU, _merge(gpus, extra.get("gpus")), source),
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
