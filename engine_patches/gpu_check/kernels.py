"""The kernels the GPU check times, looked up by name, and the ones SGLang 0.5.23 picks by default.

A kernel that cannot be loaded raises KernelUnavailable naming the kernel, the import that failed and what it needs;
nothing falls back to another implementation.
"""

from __future__ import annotations

import importlib

# name -> (module, attribute, what it needs beyond torch + triton + the sglang wheel)
KERNELS = {
    "triton_decode": ("sglang.kernels.ops.attention.decode_attention", "decode_attention_fwd", "the sglang wheel"),
    "fa3_decode": ("sgl_kernel.flash_attn", "flash_attn_with_kvcache", "sgl-kernel (SGLang's CUDA kernels wheel)"),
    "flashinfer_decode": ("flashinfer", "BatchDecodeWithPagedKVCacheWrapper", "flashinfer"),
    "flashinfer_mla_decode": ("flashinfer.mla", "BatchMLAPagedAttentionWrapper", "flashinfer"),
    "triton_moe": ("sglang.kernels.ops.moe.fused_moe_triton_kernels", "invoke_fused_moe_kernel", "the sglang wheel"),
    "marlin_moe": ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe", "fused_marlin_moe",
                   "sgl-kernel (moe_sum_reduce, ScalarType) and a CUDA toolchain for its JIT Marlin GEMM"),
    "marlin_repack": ("sglang.kernels.ops.moe.moe_wna16_marlin", "gptq_marlin_moe_repack",
                      "sgl-kernel and a CUDA toolchain for its JIT module"),
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


def default_decode_backend(kind: str, capability: tuple[int, int] | None, flashinfer: bool) -> str:
    """SGLang 0.5.23's automatic attention backend (arg_groups/model_override_base.py get_default_attn_backend),
    for decode without speculative decoding: Hopper picks FA3 for MHA/GQA and MLA alike; Blackwell trtllm_mha
    (GQA) or FlashInfer (MLA); other CUDA cards FlashInfer when installed, else Triton."""
    if capability == (9, 0):
        return "fa3"
    if capability is not None and capability[0] == 10:
        return "flashinfer" if kind == "mla" else "trtllm_mha"
    return "flashinfer" if flashinfer and kind == "gqa" else "triton"


def default_w4a16_moe_backend(capability: tuple[int, int] | None) -> str:
    """0.5.23's WNA16 MoE scheme with --moe-runner-backend auto (compressed_tensors.py): Triton on SM100/SM103,
    Marlin elsewhere on CUDA (Hopper included)."""
    return "triton" if capability is not None and capability[0] == 10 else "marlin"
