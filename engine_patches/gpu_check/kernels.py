"""What the GPU check imports to time each kernel, looked up by name: the SGLang 0.5.23 module that runs it (an
attention backend's module, which imports its kernel package at import time) or the kernel itself.

A kernel that cannot be loaded raises KernelUnavailable naming the kernel, the import that failed with its own error,
and what it needs; nothing falls back to another implementation.
"""

from __future__ import annotations

import importlib

ATTN = "sglang.srt.layers.attention"
# name -> (module, attribute, what it needs beyond torch + triton + the sglang wheel)
KERNELS = {
    "triton_decode": (f"{ATTN}.triton_backend", "TritonAttnBackend", "the sglang wheel"),
    "fa3": (f"{ATTN}.flashattention_backend", "FlashAttentionBackend",
            "sgl-kernel (SGLang's CUDA kernels: FA3 flash_attn_with_kvcache, merge_state_v2)"),
    "flashmla": (f"{ATTN}.flashmla_backend", "FlashMLABackend", "sgl-flash-mla (the flash_mla package)"),
    "flashinfer_decode": ("flashinfer", "BatchDecodeWithPagedKVCacheWrapper", "flashinfer"),
    "trtllm_mla": ("flashinfer.decode", "trtllm_batch_decode_with_kv_cache_mla", "flashinfer with TRT-LLM kernels"),
    "trtllm_mha": ("flashinfer.decode", "trtllm_batch_decode_with_kv_cache", "flashinfer with TRT-LLM kernels"),
    "triton_moe": ("sglang.kernels.ops.moe.fused_moe_triton_kernels", "invoke_fused_moe_kernel", "the sglang wheel"),
    "moe_config": ("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
                   "try_get_optimal_moe_config", "the sglang wheel"),
    "marlin_moe": ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe", "fused_marlin_moe",
                   "sgl-kernel (moe_sum_reduce, silu_and_mul) and the JIT-built Marlin MoE GEMM"),
    "marlin_repack": ("sglang.srt.hardware_backend.gpu.quantization.gptq_kernels", "gptq_marlin_moe_repack",
                      "sgl-kernel and the JIT-built repack module"),
    "marlin_utils": ("sglang.srt.layers.quantization.marlin_utils", "marlin_moe_permute_scales", "the sglang wheel"),
    "checksum": ("engine_patches.kv_checksum.kernel", "PageChecksummer", "triton"),
}


class KernelUnavailable(RuntimeError):
    def __init__(self, name: str, reason: str):
        module, attr, needs = KERNELS[name]
        super().__init__(f"{name} ({module}.{attr}) cannot run: {reason}; needs {needs}")
        self.name = name


def load(name: str):
    module, attr, _ = KERNELS[name]
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - any import failure is this kernel's error, reported by name
        raise KernelUnavailable(name, f"{type(e).__name__}: {str(e)[:200]}") from e


def default_w4a16_moe_backend(capability: tuple[int, int] | None) -> str:
    """0.5.23's WNA16 MoE scheme with --moe-runner-backend auto (compressed_tensors.py): Triton on SM100/SM103,
    Marlin elsewhere on CUDA (Hopper included)."""
    return "triton" if capability is not None and capability[0] == 10 else "marlin"
