"""Record per-layer K/V absolute maxima as SGLang writes its KV cache (a BF16-KV calibration run).

Hooks `MHATokenToKVPool.set_kv_buffer` (GLM: K and V) and `MLATokenToKVPool.set_kv_buffer` /
`set_mla_kv_buffer` (Kimi: latent and rope parts of the one cached row). Each SGLang scheduler process (one per
rank) keeps its maxima as device tensors (no host sync per write) and dumps them to `<path>.rank<R>.json`,
atomically, from the forward thread, at most every `interval_s` seconds and at exit. The dump runs on a write to
the pool's first layer outside CUDA-graph capture, i.e. on every eager (prefill) forward, so a small request
after the calibration prompts flushes a fresh dump: `capbench calibrate-kv-scales` does exactly that.

Coverage: writes inside a replayed CUDA graph run no Python, so with CUDA graphs on, decode tokens are not seen;
prompt (prefill) tokens always are. Start the calibration server with `--disable-cuda-graph` to count both.
Fused writers that bypass set_kv_buffer (FA3's fused rope+KV write for bf16 MHA models that enable it; GLM-4.x
in SGLang 0.5.23 does not) are not seen either.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path

import torch

from engine_patches.fp8_scales import draft


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class AmaxRecorder:
    """Running |max| per layer for two parts ("k"/"v": MHA K and V; MLA latent and rope)."""

    def __init__(self, path: str | Path, layout: str, interval_s: float = 2.0):
        self.path = Path(path)
        self.layout = layout
        self.interval_s = interval_s
        self.amax: dict[int, dict[str, torch.Tensor]] = {}
        self.tokens: dict[int, int] = {}
        self.last_dump = 0.0
        self.first_layer: int | None = None
        self.draft_layers: set[int] = set()  # MTP draft layers seen (their checkpoint ids)
        atexit.register(self._dump_at_exit)

    def observe(self, layer_id: int, part: str, x: torch.Tensor | None) -> None:
        if x is None or x.numel() == 0 or _capturing():
            return
        slot = self.amax.setdefault(layer_id, {})
        m = x.detach().abs().amax().float()
        if part in slot:
            torch.maximum(slot[part], m, out=slot[part])
        else:
            slot[part] = m.clone()
        if part == "k":
            self.tokens[layer_id] = self.tokens.get(layer_id, 0) + x.shape[0]

    def after_write(self, layer_id: int, layer=None) -> None:
        if getattr(layer, draft.LAYER_ATTR, None) is not None:
            self.draft_layers.add(layer_id)
            return  # the draft's pool: its first layer is not the target's
        if self.first_layer is None or layer_id < self.first_layer:
            self.first_layer = layer_id
        if layer_id == self.first_layer and time.monotonic() - self.last_dump >= self.interval_s and not _capturing():
            self.dump()

    def snapshot(self) -> dict:
        layers = {}
        for layer_id, parts in sorted(self.amax.items()):
            layers[layer_id] = {p: float(parts[p]) if p in parts else 0.0 for p in ("k", "v")}
            layers[layer_id]["tokens"] = self.tokens.get(layer_id, 0)
        return {"rank": _rank(), "pid": os.getpid(), "layout": self.layout, "written_at": time.time(),
                "layers": layers, "draft_layers": sorted(self.draft_layers)}

    def _dump_at_exit(self) -> None:
        try:
            self.dump()
        except Exception as e:  # noqa: BLE001 - the CUDA context may already be gone; the periodic dumps stand
            print(f"capbench: final K/V amax dump failed in pid {os.getpid()}: {e!r}")

    def dump(self) -> Path | None:
        if not self.amax:
            return None
        self.last_dump = time.monotonic()
        out = dump_path(self.path, _rank())
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, out)
        return out


def dump_path(path: str | Path, rank: int) -> Path:
    path = Path(path)
    return path.with_name(f"{path.name}.rank{rank}.json")


def read_dumps(path: str | Path) -> list[dict]:
    path = Path(path)
    return [json.loads(p.read_text()) for p in sorted(path.parent.glob(f"{path.name}.rank*.json"))]


def _layer_id(layer, layer_id_override) -> int:
    return draft.layer_id(layer, layer_id_override)  # an MTP draft layer counts as its checkpoint layer


def install(path: str | Path, interval_s: float = 2.0) -> dict[str, AmaxRecorder]:
    """Wrap the pools' write methods (class-level, this process). Returns the recorders by layout."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    draft.install_tagging()
    recorders = {"mha": AmaxRecorder(path, "mha", interval_s), "mla": AmaxRecorder(path, "mla", interval_s)}
    mha, mla = recorders["mha"], recorders["mla"]
    orig_mha_set = MHATokenToKVPool.set_kv_buffer
    orig_mla_set = MLATokenToKVPool.set_kv_buffer
    orig_mla_set_mla = MLATokenToKVPool.set_mla_kv_buffer

    def mha_set_kv_buffer(self, layer, loc_info, cache_k, cache_v, *args, layer_id_override=None, **kw):
        lid = _layer_id(layer, layer_id_override)
        mha.observe(lid, "k", cache_k)
        mha.observe(lid, "v", cache_v)
        out = orig_mha_set(self, layer, loc_info, cache_k, cache_v, *args, layer_id_override=layer_id_override, **kw)
        mha.after_write(lid, layer)
        return out

    def mla_set_kv_buffer(self, layer, loc_info, cache_k, cache_v, layer_id_override=None):
        lid = _layer_id(layer, layer_id_override)
        mla.observe(lid, "k", cache_k[..., : self.kv_lora_rank])
        mla.observe(lid, "v", cache_k[..., self.kv_lora_rank :])
        out = orig_mla_set(self, layer, loc_info, cache_k, cache_v, layer_id_override=layer_id_override)
        mla.after_write(lid, layer)
        return out

    def mla_set_mla_kv_buffer(self, layer, loc_info, cache_k_nope, cache_k_rope, layer_id_override=None):
        lid = _layer_id(layer, layer_id_override)
        mla.observe(lid, "k", cache_k_nope)
        mla.observe(lid, "v", cache_k_rope)
        out = orig_mla_set_mla(self, layer, loc_info, cache_k_nope, cache_k_rope, layer_id_override=layer_id_override)
        mla.after_write(lid, layer)
        return out

    MHATokenToKVPool.set_kv_buffer = mha_set_kv_buffer
    MLATokenToKVPool.set_kv_buffer = mla_set_kv_buffer
    MLATokenToKVPool.set_mla_kv_buffer = mla_set_mla_kv_buffer
    return recorders
