"""Roofline step times of one SGLang instance: what a forward pass must read and compute, on one GPU of it.

A step (a decode batch, a prefill chunk, or both) takes
    max(bytes / (HBM bandwidth * hbm_eff), flops / (TFLOP/s * eff), layers * layer_floor)
    + 2 all-reduces per layer (ring over NVLink, message = tokens * hidden * 2 bytes) + step_overhead.
Bytes: the routed experts the step's tokens activate (expected distinct experts of top-k routing over E experts
with B tokens: E * (1 - (1 - k/E)^B), the same fraction of every MoE layer's expert bytes on this GPU), all the
other weights (attention, shared experts, dense MLPs, lm_head), and the KV cache of every sequence the step
attends to (cell_bytes * context: FP8 KV halves it). Flops: 2 * active parameters per token on this GPU, plus
attention (decode: MLA absorbed, linear in context; prefill: causal, quadratic in the chunk). INT4 experts are
W4A16: half a byte read per weight, computed on BF16 tensor cores at int4_dequant_factor times the BF16 cost.

Not modelled: speculative decoding (MTP/EAGLE), expert-parallel load imbalance, DP-attention's padding,
communication/computation overlap beyond the all-reduce, the CPU cost of long prompts' tokenization.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from bench.errors import BadInput
from bench.model.capacity import Deployment, capacity, cell_bytes, weight_bytes, weight_formats
from bench.model.catalog import DATA

DEFAULT_CALIBRATION = DATA / "calibration" / "default.yaml"
FITTED_CALIBRATION = DATA / "calibration" / "fitted.json"


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks a real SGLang step reaches, and fixed costs (data/calibration/default.yaml)."""

    hbm_eff: float = 0.75
    bf16_eff: float = 0.55
    fp8_eff: float = 0.45
    int8_eff: float = 0.45
    allreduce_eff: float = 0.7
    allreduce_latency_us: float = 10.0
    step_overhead_ms: float = 2.0
    layer_floor_us: float = 250.0
    int4_dequant_factor: float = 1.25
    prefill_eff: float = 0.8

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def updated(self, values: dict) -> Efficiency:
        known = {f.name for f in fields(self)}
        clean = {}
        for key, val in values.items():
            if key not in known:
                raise BadInput(f"calibration: unknown factor '{key}'; valid: {', '.join(sorted(known))}")
            val = val.get("value") if isinstance(val, dict) else val
            if not isinstance(val, int | float) or isinstance(val, bool) or val < 0:
                raise BadInput(f"calibration: '{key}' must be a non-negative number, got {val!r}")
            clean[key] = float(val)
        return replace(self, **clean)


def _read_calibration(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(f"calibration file not readable: {path}") from e
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise BadInput(f"calibration file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}") from e
    if not isinstance(raw, dict):
        raise BadInput(f"calibration file {path} must hold a map of factors")
    return raw


def _layers(raw: dict, gpu_id: str) -> list[dict]:
    """A file is flat factors, or {default: {...}, gpus: {id: {...}}}; returns the maps that apply to gpu_id."""
    if "default" in raw or "gpus" in raw:
        return [raw.get("default") or {}, (raw.get("gpus") or {}).get(gpu_id) or {}]
    return [{k: v for k, v in raw.items() if k not in ("gpu", "model", "source", "fitted_at", "runs")}]


def load_efficiency(gpu_id: str, path: str | Path | None = None) -> Efficiency:
    """Shipped priors, then data/calibration/fitted.json if present, then the user's file."""
    eff = Efficiency()
    files = [DEFAULT_CALIBRATION] + [p for p in (FITTED_CALIBRATION,) if p.exists()]
    if path is not None:
        files.append(Path(path))
    for file in files:
        for layer in _layers(_read_calibration(file), gpu_id):
            eff = eff.updated(layer)
    return eff


def expected_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit when `tokens` tokens each pick top_k of `experts` uniformly."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def prefill_pairs(new_tokens: int, prefix: int) -> float:
    """Causal attention (query, key) pairs of a chunk of new_tokens after prefix cached tokens."""
    return new_tokens * prefix + new_tokens * (new_tokens + 1) / 2


class PerfModel:
    """Step times of one instance. All figures are for one GPU; every GPU of the instance runs the same step."""

    def __init__(self, dep: Deployment, eff: Efficiency | None = None) -> None:
        self.dep, self.eff = dep, eff or load_efficiency(dep.gpu.id)
        m, g = dep.model, dep.gpu
        self.layers = m.layers
        attn_tp = dep.tp // dep.dp
        self.dp = dep.dp
        wb = weight_bytes(m, dep.weights, dep.tp, dep.dp)
        params = weight_bytes(m, "bf16", dep.tp, dep.dp)  # bf16 = 2 bytes per parameter
        self.expert_bytes = wb.routed_experts
        self.other_bytes = wb.total - wb.routed_experts - wb.embeddings / 2  # the input embedding is a gather
        self.expert_frac_per_token = m.experts_per_token / m.routed_experts
        self.experts, self.top_k = m.routed_experts, m.experts_per_token
        self.cell = cell_bytes(m, dep.kv_dtype, attn_tp)
        self.hidden = m.hidden_size
        experts_fmt, rest_fmt = weight_formats(m, dep.weights)
        # linear flops per token on this GPU, by the tensor-core kind that runs them
        expert_flops = 2 * params.routed_experts / 2 * self.expert_frac_per_token
        rest_flops = 2 * (params.shared_experts + params.attention + params.dense_mlp + params.other
                          + params.embeddings / 2) / 2
        self.flops_per_token = {"bf16": 0.0, "fp8": 0.0}
        self._add_flops(experts_fmt, expert_flops)
        self._add_flops(rest_fmt, rest_flops)
        heads = m.attention_heads / attn_tp
        if m.attention == "mla":  # decode absorbs W_UK/W_UV: scores and values over the 512+64 latent
            self.decode_attn_flops = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) * m.layers
            self.prefill_attn_flops = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * m.layers
        else:
            self.decode_attn_flops = 2 * heads * (m.head_dim + m.v_head_dim) * m.layers
            self.prefill_attn_flops = self.decode_attn_flops
        fp8_peak = g.fp8_tflops or g.bf16_tflops  # no FP8 tensor cores (A100): W8A16 runs on BF16 ones
        fp8_eff = self.eff.fp8_eff if g.fp8_tflops else self.eff.bf16_eff
        self.flops_per_s = {"bf16": g.bf16_tflops * 1e12 * self.eff.bf16_eff, "fp8": fp8_peak * 1e12 * fp8_eff}
        self.bytes_per_s = g.hbm_tbps * 1e12 * self.eff.hbm_eff
        self.tp = dep.tp
        link_gbps = g.interconnect_gbps / 2 if dep.tp <= g.gpus_per_node else g.internode_gbps
        self.link_bytes_per_s = link_gbps * 1e9 * self.eff.allreduce_eff
        self.floor_s = m.layers * self.eff.layer_floor_us * 1e-6
        self.overhead_s = self.eff.step_overhead_ms * 1e-3
        # step_time's constants: seconds per byte-group, per token, per context token, per attention pair
        self._experts_s, self._other_s = self.expert_bytes / self.bytes_per_s, self.other_bytes / self.bytes_per_s
        self._kv_s = self.cell / self.dp / self.bytes_per_s
        self._linear_s = sum(self.flops_per_token[k] / self.flops_per_s[k] for k in ("bf16", "fp8"))
        self._decode_attn_s = self.decode_attn_flops / self.dp / self.flops_per_s["bf16"]
        self._prefill_attn_s = self.prefill_attn_flops / self.eff.prefill_eff / self.dp / self.flops_per_s["bf16"]
        self._miss = 1.0 - self.top_k / self.experts

    def _add_flops(self, fmt: str, flops: float) -> None:
        if fmt.startswith("int4"):
            self.flops_per_token["bf16"] += flops * self.eff.int4_dequant_factor
        elif fmt.startswith("fp8"):
            self.flops_per_token["fp8"] += flops
        else:
            self.flops_per_token["bf16"] += flops

    def allreduce_s(self, tokens: int) -> float:
        """Two all-reduces per layer of tokens * hidden bf16 activations, ring algorithm."""
        if self.tp == 1 or tokens <= 0:
            return 0.0
        msg = tokens * self.hidden * 2
        one = 2 * (self.tp - 1) / self.tp * msg / self.link_bytes_per_s + self.eff.allreduce_latency_us * 1e-6
        return 2 * self.layers * one

    def parts(self, decode_batch: int, decode_ctx: int, prefill_tokens: int = 0, prefill_attn: float = 0.0,
              prefill_ctx: int = 0) -> dict[str, float]:
        """Seconds of each roofline term of one step. decode_ctx: sum of the decoding sequences' contexts;
        prefill_attn: attention pairs of the prefill chunks; prefill_ctx: KV tokens they read or write."""
        tokens = decode_batch + prefill_tokens
        frac = expected_experts(self.experts, self.top_k, tokens) / self.experts
        kv = self.cell * (decode_ctx + prefill_ctx) / self.dp
        mem = (self.expert_bytes * frac + self.other_bytes + kv) / self.bytes_per_s
        linear = sum(tokens * self.flops_per_token[k] / self.flops_per_s[k] for k in ("bf16", "fp8"))
        attn = (self.decode_attn_flops * decode_ctx
                + self.prefill_attn_flops * prefill_attn / self.eff.prefill_eff) / self.dp / self.flops_per_s["bf16"]
        if prefill_tokens:  # prefill's linear layers run at prefill_eff of the GEMM efficiency
            share = prefill_tokens / tokens
            linear *= 1 - share + share / self.eff.prefill_eff
        return {"memory": mem, "compute": linear + attn, "floor": self.floor_s if tokens else 0.0,
                "allreduce": self.allreduce_s(tokens), "overhead": self.overhead_s if tokens else 0.0}

    def step_time(self, decode_batch: int, decode_ctx: int, prefill_tokens: int = 0, prefill_attn: float = 0.0,
                  prefill_ctx: int = 0) -> float:
        """parts() summed as the roofline sums them (inlined: the scheduler calls this every step)."""
        tokens = decode_batch + prefill_tokens
        if tokens <= 0:
            return 0.0
        mem = self._experts_s * (1.0 - self._miss ** tokens) + self._other_s + self._kv_s * (decode_ctx + prefill_ctx)
        linear = tokens * self._linear_s
        if prefill_tokens:
            share = prefill_tokens / tokens
            linear *= 1 - share + share / self.eff.prefill_eff
        compute = linear + self._decode_attn_s * decode_ctx + self._prefill_attn_s * prefill_attn
        return max(mem, compute, self.floor_s) + self.allreduce_s(tokens) + self.overhead_s

    def decode_step_time(self, ctx_lens: list[int]) -> float:
        """One decode step of a batch whose sequences have these context lengths."""
        return self.step_time(len(ctx_lens), sum(ctx_lens))

    def prefill_time(self, tokens: int, prefix: int = 0, chunk: int | None = None) -> float:
        """Prefill of `tokens` new tokens after `prefix` cached ones, in chunks of `chunk` (SGLang's
        chunked_prefill_size) run back to back."""
        chunk = chunk or tokens
        total, done = 0.0, 0
        while done < tokens:
            n = min(chunk, tokens - done)
            total += self.step_time(0, 0, n, prefill_pairs(n, prefix + done), prefix + done + n)
            done += n
        return total

    def decode_throughput(self, batch: int, context: int) -> float:
        """Output tokens per second of the instance decoding `batch` sequences of `context` tokens each."""
        return batch / self.step_time(batch, batch * context)


def cost_per_million_tokens(dep: Deployment, tokens_per_s: float) -> float:
    """$ per 1M output tokens: GPU $/s * GPUs / output tok/s * 1e6."""
    if tokens_per_s <= 0:
        return float("inf")
    return dep.gpu.price_per_gpu_hour / 3600 * dep.tp / tokens_per_s * 1e6


def summary(dep: Deployment, context: int = 4096, eff: Efficiency | None = None) -> dict:
    """Headline figures: single-stream speed and the throughput at the largest batch that fits `context`."""
    pm, cap = PerfModel(dep, eff), capacity(dep, with_ratios=False)
    batch = max(1, min(cap.max_running_requests, cap.kv_pool_tokens_total // max(context, 1)))
    tput = pm.decode_throughput(batch, context)
    return {
        "single_stream_tok_s": pm.decode_throughput(1, context),
        "max_batch_at_context": batch,
        "decode_tok_s_at_max_batch": tput,
        "tpot_ms_at_max_batch": 1e3 * batch / tput,
        "prefill_tok_s": context / pm.prefill_time(context),
        "usd_per_million_output_tokens": cost_per_million_tokens(dep, tput),
    }
