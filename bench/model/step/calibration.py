"""The performance model's factors: what real kernels reach of the datasheet, and the fixed costs around them.

Each factor has a physical meaning and a source (data/calibration/default.yaml says which). Precedence:
default.yaml (`default:` then `gpus.<id>:`) < corpus.json (`capbench validate --fit` on the published corpus,
shipped) < fitted.json (`capbench calibrate` on your own runs) < a file given with --calibration. A file may be flat
({hbm_eff: 0.8, ...}) or have default.yaml's shape; a value may be a number or {value: x, source: "..."}.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, create_model

from bench import files
from bench.errors import BadInput
from bench.model.fits.catalog import DATA

DEFAULT_CALIBRATION = DATA / "calibration" / "default.yaml"
CORPUS_CALIBRATION = DATA / "calibration" / "corpus.json"
FITTED_CALIBRATION = DATA / "calibration" / "fitted.json"


@dataclass(frozen=True)
class Efficiency:
    hbm_eff: float = 0.8  # fraction of HBM bandwidth that weight and KV streaming reach
    bf16_eff: float = 0.6  # fraction of the BF16 tensor-core peak a large GEMM reaches
    fp8_eff: float = 0.5  # the same for FP8 (block-scaled) GEMMs
    int8_eff: float = 0.5
    gemm_m_half: float = 16.0  # rows (tokens) per GEMM at which it reaches half its large-GEMM efficiency
    gemm_n_half: float = 128.0  # columns of an expert's slice on one GPU at which its GEMM reaches half speed
    int4_dequant: float = 1.5  # W4A16 compute relative to BF16 at large batch (unpacking before the MMA)
    int4_moe_unpack: float = 0.0026  # INT4 expert weights a W4A16 fused-MoE kernel unpacks per s, / BF16 FLOP/s
    int4_moe_m_tile: float = 64.0  # rows of one expert a W4A16 MoE tile computes per weight unpacked
    overlap: float = 0.6  # share of the shorter of memory and compute time hidden under the longer
    kernel_us: float = 4.0  # GPU time each kernel costs beyond its work (launch gap, ramp-up, tail)
    launch_us: float = 6.0  # CPU time to launch one kernel outside a CUDA graph (prefill, large decode batches)
    allreduce_latency_us: float = 8.0  # one small all-reduce (custom all-reduce on NVLink)
    allreduce_eff: float = 0.7  # bus bandwidth an all-reduce reaches, of the link's
    dp_gather_latency_us: float = 25.0  # one all-gather or reduce-scatter around the MoE with DP attention (NCCL)
    step_overhead_ms: float = 0.3  # scheduler time per step not hidden by SGLang's overlap scheduling
    request_overhead_ms: float = 30.0  # per request outside the GPU: HTTP, tokenizing, queueing, first chunk
    prefill_attn_eff: float = 0.4  # prefill attention's share of the BF16 peak (FlashAttention/FlashMLA)
    mtp_accept: float = 0.7  # chance each MTP draft token is accepted (accept length 1 + p + p^2 + ...)
    ep_skew: float = 1.0  # routing imbalance beyond uniform top-k (multiplies the spread of per-rank load)
    stream_token_us: float = 100.0  # CPU time the server spends per streamed output token (detokenize, SSE, HTTP)
    kernel_scale: float = 1.0  # measured kernel-table latencies to this deployment's (host, clocks, fusion)
    roofline_scale: float = 1.0  # the roofline's GPU time to this GPU's (fitted per GPU without kernel tables)

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def updated(self, values: dict) -> Efficiency:
        """These factors with `values` (checked by the calibration schema) over them."""
        return replace(self, **files.check(Factors, values, "calibration").model_dump(exclude_none=True))


# each factor's range: a fraction of a datasheet figure is above 0 and at most 1 (a division by hbm_eff 0 is no
# model), a rate or size above 0, a time at least 0; all finite (bench/files.py)
FRACTIONS = {"hbm_eff", "bf16_eff", "fp8_eff", "int8_eff", "allreduce_eff", "prefill_attn_eff"}
SHARES = {"overlap", "mtp_accept"}  # 0 is a meaning (nothing hidden, nothing accepted)
TIMES = {"kernel_us", "launch_us", "allreduce_latency_us", "dp_gather_latency_us", "step_overhead_ms",
         "request_overhead_ms", "stream_token_us"}


def _value(v: object) -> object:
    """A factor is a number or {value: x, source: "..."}."""
    if isinstance(v, dict) and set(v) <= {"value", "source"} and "value" in v:
        return v["value"]
    if isinstance(v, dict):
        raise ValueError("a factor is a number or {value: x, source: \"...\"}")
    return v


def _factor(name: str) -> object:
    bounds = {"gt": 0, "le": 1} if name in FRACTIONS else {"ge": 0, "le": 1} if name in SHARES else \
        {"ge": 0, "le": 1e6} if name in TIMES else {"gt": 0, "le": 1e6}
    return Annotated[Annotated[float, Field(allow_inf_nan=False, **bounds)] | None, BeforeValidator(_value)]


Factors = create_model("Factors", __base__=files.Schema,
                       **{f.name: (_factor(f.name), None) for f in fields(Efficiency)})
META = ("gpu", "model", "source", "fitted_at", "runs", "kernels", "validation", "method")
_Meta = {k: (Any, None) for k in META}
FlatFile = create_model("FlatFile", __base__=Factors, **_Meta)
Kernels = dict[str, Annotated[int, BeforeValidator(_value), Field(ge=1, le=10_000)]]
LayeredFile = create_model("LayeredFile", __base__=files.Schema, **{
    **_Meta, "default": (Factors | None, None), "gpus": (dict[str, Factors] | None, None),
    "kernels": (Kernels | None, None), "scale": (dict[str, Any] | None, None)})


_parsed: dict[tuple, dict] = {}


def _read(path: Path) -> dict:
    """A calibration file's map, parsed once per version of the file (the plan search asks for it per deployment)."""
    key = _stamp(path)
    if key in _parsed:
        return copy.deepcopy(_parsed[key])
    raw = files.read(path, "calibration")
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: a calibration file holds a map of factors, not a {type(raw).__name__}")
    files.check(LayeredFile if "default" in raw or "gpus" in raw else FlatFile, raw, str(path))
    _parsed[key] = raw
    return copy.deepcopy(raw)


def _layers(raw: dict, gpu_id: str) -> list[dict]:
    """A file is flat factors, or {default: {...}, gpus: {id: {...}}}; the maps that apply to gpu_id."""
    if "default" in raw or "gpus" in raw:
        return [raw.get("default") or {}, (raw.get("gpus") or {}).get(gpu_id) or {}]
    return [{k: v for k, v in raw.items() if k not in META}]


def load_efficiency(gpu_id: str, path: str | Path | None = None, fitted: bool = True) -> Efficiency:
    """Priors, the corpus fit (shipped), your runs' fit (unless fitted=False), then the file given."""
    files = [DEFAULT_CALIBRATION] + [f for f in (CORPUS_CALIBRATION, FITTED_CALIBRATION if fitted else None)
                                     if f is not None and f.exists()]
    if path is not None:
        files.append(Path(path))
    key = (gpu_id, *(_stamp(f) for f in files))
    if key not in _loaded:
        eff = Efficiency()
        for file in files:
            for layer in _layers(_read(file), gpu_id):
                eff = eff.updated(layer)
        _loaded[key] = eff
    return _loaded[key]


_loaded: dict[tuple, Efficiency] = {}


def _stamp(path: Path) -> tuple:
    """A file's identity for the memos: its content, so a rewritten file (capbench calibrate) is read again."""
    try:
        return str(path), hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return str(path), None  # _read says it is not readable


def kernels_per_layer() -> dict[str, int]:
    """Kernels one decoder layer launches, by attention kind (counted from SGLang's model code: default.yaml)."""
    raw = _read(DEFAULT_CALIBRATION).get("kernels") or {}
    return {k: int(v.get("value") if isinstance(v, dict) else v) for k, v in raw.items()}
