"""What a twin models and how it serves: TwinConfig, and the `twin:MODEL@GPUxN,key=value` spec that names one."""

from __future__ import annotations

from dataclasses import dataclass, fields

from bench.checks import GPUS_MAX
from bench.errors import BadInput
from bench.model import Deployment, catalog, parse_spec
from bench.model.pd import disagg


@dataclass
class TwinConfig:
    model: str = "kimi-k2-thinking"
    gpu: str = "h200"
    tp: int = 8
    dp: int = 1
    kv_dtype: str = "bf16"
    weights: str = "native"
    context: int | None = None
    mem_fraction: float | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    time_scale: float = 1.0  # 10: ten times faster than the modelled GPUs
    seed: int = 0
    drift: float = 0.0  # fraction of greedy tokens that differ from a drift-0 twin's (quality-drift tests)
    calibration: str | None = None
    served_model_name: str | None = None  # default: the model's Hugging Face repo, as SGLang serves it
    max_running_requests: int | None = None
    max_total_tokens: int | None = None  # SGLang --max-total-tokens: cap the KV pool
    mixed_chunk: bool = False
    stream_interval: int = 1  # SGLang --stream-interval: a stream gets its first token at once, then every N tokens
    prefill_tp: int = 0  # > 0: prefill/decode disaggregated; a prefill instance of this many GPUs in front of the
    # decode instance of `tp` GPUs (both DP attention + DeepEP), the KV crossing between (bench/twin/pd.py)

    def deployment(self) -> Deployment:
        return Deployment(catalog.model(self.model), catalog.gpu(self.gpu), self.tp, self.dp, self.kv_dtype,
                          self.weights, self.context, self.mem_fraction)


def parse_twin_spec(spec: str) -> TwinConfig:
    """'twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3,weights=int4-g32,time_scale=10' -> TwinConfig."""
    kinds = {f.name: f.type for f in fields(TwinConfig)}
    s = parse_spec(spec, known=set(kinds) - {"model"})
    values: dict = {"model": s.model, "gpu": s.gpu, "tp": s.tp}
    for key in s.options:
        kind = str(kinds[key])
        values[key] = s.value(key, bool if "bool" in kind else int if "int" in kind else
                              float if "float" in kind else str)
    config = TwinConfig(**values)
    config.deployment()  # validate now
    if config.stream_interval < 1:
        raise BadInput(f"stream_interval is SGLang's --stream-interval, at least 1, got {config.stream_interval}")
    if "prefill_tp" in s.options and not 1 <= config.prefill_tp <= GPUS_MAX:
        raise BadInput(f"prefill_tp is the prefill instance's GPUs, 1 to {GPUS_MAX} (leave it out for a colocated "
                       f"twin), got {config.prefill_tp}")
    if config.prefill_tp:
        pd_shape(config).deployment("prefill")
    return config


def pd_shape(config: TwinConfig) -> disagg.Shape:
    """The disaggregated deployment a twin with prefill_tp > 0 plays."""
    return disagg.Shape(config.model, config.gpu, config.prefill_tp, config.tp, config.kv_dtype, config.weights,
                        context=config.context)
