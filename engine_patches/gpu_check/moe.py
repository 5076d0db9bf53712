"""One MoE layer's local experts on one GPU at EP8 (Kimi K2: 48 of 384 experts, 7168 -> 2x2048 -> 7168; GLM-4.6: 20
of 160, 5120 -> 2x1536 -> 5120), SwiGLU, both GEMMs, over a step of T tokens (1 to 8k) routed top-8 and balanced:
each token's eight experts are one per EP rank, so each GPU computes T token-expert pairs, one local expert a token
(passed as [T, 1] routing to the kernels). Weights are random: timing only.

Formats, as SGLang 0.5.23 runs them:
- BF16 and FP8 block-128 (W8A8, the activation quantised per 128-column group inside the call) on SGLang's Triton
  fused MoE kernel (`invoke_fused_moe_kernel`), with the config SGLang picks (`try_get_optimal_moe_config`: its tuned
  file for the GPU and shape, else its default);
- INT4 W4A16 group 32 (Kimi K2 Thinking's experts) on the same Triton kernel (`--moe-runner-backend triton`) and on
  Marlin (`fused_marlin_moe`, 0.5.23's default on Hopper: CompressedTensorsWNA16MoE), weights repacked by SGLang's
  `gptq_marlin_moe_repack` and scales permuted by `marlin_moe_permute_scales`.
The token/expert alignment (sgl-kernel's moe_align_block_size in SGLang) is done once per case in torch and kept
out of the timed call; the SwiGLU between the GEMMs runs in torch (sgl-kernel's silu_and_mul in SGLang)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_patches.gpu_check.kernels import load
from engine_patches.quant_gpu_check import GROUP, pack_int4


@dataclass(frozen=True)
class Moe:
    experts: int  # the model's routed experts
    ep: int
    hidden: int
    inter: int
    topk: int

    @property
    def local(self) -> int:
        return self.experts // self.ep


SHAPES = {"kimi-k2": Moe(384, 8, 7168, 2048, 8), "glm-4.6": Moe(160, 8, 5120, 1536, 8)}
TINY = {"kimi-k2": Moe(16, 8, 256, 128, 8), "glm-4.6": Moe(16, 8, 128, 128, 8)}  # FP8 blocks: multiples of 128
# format -> (backend, AIConfigurator's moe dtype, capbench's expert format, kernel)
FORMATS = {"bf16": ("triton", "bfloat16", "bf16", "sglang_fused_moe_triton"),
           "fp8": ("triton", "fp8_block", "fp8-block128", "sglang_fused_moe_triton"),
           "int4": ("triton", "int4_wo", "int4-g32", "sglang_fused_moe_triton"),
           "int4-marlin": ("marlin", "int4_wo", "int4-g32", "sglang_marlin_moe")}
QUANT = {"bf16": {}, "fp8": {"use_fp8_w8a8": True, "block_shape": [128, 128]},
         "int4": {"use_int4_w4a16": True, "block_shape": [0, GROUP]}}
CONFIG_DTYPE = {"bf16": None, "fp8": "fp8_w8a8", "int4": "int4_w4a16"}


def label(model: str, shape: Moe, fmt: str, tokens: int) -> str:
    return (f"{model} {shape.local}/{shape.experts} experts x ({shape.hidden} -> 2x{shape.inter} -> {shape.hidden}),"
            f" top-{shape.topk} EP{shape.ep}, {tokens} tokens, {fmt}")


def routing(tokens: int, shape: Moe, dtype, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, topk weights [T, 1], topk ids [T, 1]): token t's one local expert, t mod the local experts (balanced)."""
    gen = torch.Generator(device=device).manual_seed(tokens)
    x = torch.randn(tokens, shape.hidden, generator=gen, device=device).to(dtype)
    ids = (torch.arange(tokens, device=device) % shape.local).to(torch.int32)[:, None]
    return x, torch.full((tokens, 1), 1.0 / shape.topk, device=device), ids


def fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-128 FP8: [E, rows, cols] e4m3 and [E, rows/128, cols/128] float32 scales (a DeepSeek FP8 checkpoint's)."""
    e, rows, cols = w.shape
    b = w.float().view(e, rows // 128, 128, cols // 128, 128)
    scale = b.abs().amax(dim=(2, 4)).clamp_min(1e-8) / 448.0
    q = (b / scale[:, :, None, :, None]).to(torch.float8_e4m3fn).view(e, rows, cols)
    return q, scale


class Experts:
    """One format's local expert weights on the device, made once; `call(tokens)` gives one timed step."""

    def __init__(self, shape: Moe, fmt: str, dtype, device):
        self.shape, self.fmt, self.dtype, self.device = shape, fmt, dtype, device
        gen = torch.Generator(device=device).manual_seed(11)
        e, k, n = shape.local, shape.hidden, shape.inter
        w13 = (torch.randn(e, 2 * n, k, generator=gen, device=device) * 0.02).to(dtype)
        w2 = (torch.randn(e, k, n, generator=gen, device=device) * 0.02).to(dtype)
        self.scales = (None, None)
        if fmt == "int4-marlin":
            self._marlin(gen)
            return
        self.invoke = load("triton_moe")
        self.optimal_config = load("moe_config")
        if fmt == "int4":
            (w13, s13), (w2, s2) = pack_int4(w13), pack_int4(w2)
            self.scales = (s13, s2)
        elif fmt == "fp8":
            (w13, s13), (w2, s2) = fp8_block(w13), fp8_block(w2)
            self.scales = (s13, s2)
        self.w13, self.w2 = w13, w2

    def _marlin(self, gen) -> None:
        self.fused_marlin_moe = load("marlin_moe")
        repack, permute = load("marlin_repack"), load("marlin_utils")
        from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace

        e, k, n, dev = self.shape.local, self.shape.hidden, self.shape.inter, self.device

        def packed(rows_in: int, cols_out: int) -> torch.Tensor:  # [E, K/8, N] int32: 8 INT4 values a word
            return torch.randint(-2**31, 2**31 - 1, (e, rows_in // 8, cols_out), generator=gen, device=dev,
                                 dtype=torch.int32)

        self.empty = torch.empty((e, 0), dtype=torch.int32, device=dev)
        self.w13 = repack(packed(k, 2 * n), self.empty, k, 2 * n, 4)
        self.w2 = repack(packed(n, k), self.empty, n, k, 4)
        self.scales = (permute((torch.rand(e, k // GROUP, 2 * n, generator=gen, device=dev) * 0.01).to(self.dtype),
                               k, 2 * n, GROUP),
                       permute((torch.rand(e, n // GROUP, k, generator=gen, device=dev) * 0.01).to(self.dtype),
                               n, k, GROUP))
        self.workspace = marlin_make_workspace(dev, 4)

    def call(self, tokens: int):
        x, topk_w, topk_ids = routing(tokens, self.shape, self.dtype, self.device)
        if self.fmt == "int4-marlin":
            logits = torch.zeros(tokens, self.shape.local, device=self.device)
            s13, s2 = self.scales
            return lambda: self.fused_marlin_moe(
                x, self.w13, self.w2, s13, s2, logits, topk_w, topk_ids, global_num_experts=self.shape.local,
                g_idx1=self.empty, g_idx2=self.empty, sort_indices1=self.empty, sort_indices2=self.empty,
                workspace=self.workspace, num_bits=4, is_k_full=True)
        config, down = self._configs(tokens)
        from engine_patches.int4_moe.kernel import align_block_size

        aligned = align_block_size(topk_ids, self.shape.local, config["BLOCK_SIZE_M"])  # host sync: not timed
        return lambda: self._triton(x, topk_w, topk_ids, config, down, aligned)

    def _configs(self, tokens: int) -> tuple[dict, dict]:
        """SGLang's choice (fused_moe.py's call of try_get_optimal_moe_config: its tuned file for this GPU and shape,
        else its default), TMA flags dropped. Off CUDA (no device name to look a file up by) its default."""
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_default_config

        block = QUANT[self.fmt].get("block_shape") if self.fmt == "fp8" else None
        if self.device.type != "cuda":
            config = get_default_config(tokens, self.w2.shape[0], self.w2.shape[2], self.w13.shape[2],
                                        self.shape.topk, CONFIG_DTYPE[self.fmt], False, block)
            down = None
        else:
            config, (down, _) = self.optimal_config(self.w13.shape, self.w2.shape, self.shape.topk,
                                                    CONFIG_DTYPE[self.fmt], tokens, block_shape=block,
                                                    return_down_config=True)
        config = {k: v for k, v in config.items() if k != "USE_TMA"}
        down = {k: v for k, v in (down or config).items() if k != "USE_TMA"}
        down["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]  # one alignment for both GEMMs
        return config, down

    def _triton(self, x, topk_w, topk_ids, config, down, aligned) -> torch.Tensor:
        import triton.language as tl

        quant = {"use_fp8_w8a8": False, "use_int8_w8a8": False, "use_int8_w8a16": False, "use_int4_w4a16": False,
                 "per_channel_quant": False, "block_shape": None, **QUANT[self.fmt]}
        compute = tl.float16 if x.dtype == torch.float16 else tl.bfloat16
        tokens, two_n = x.shape[0], self.w13.shape[1]
        s13, s2 = self.scales
        up = torch.empty(tokens, 1, two_n, dtype=x.dtype, device=x.device)
        self.invoke(x, self.w13, None, up, None, s13, None, topk_w, topk_ids, *aligned, False, 1, config, compute,
                    **quant)
        gate, lin = up.view(-1, two_n).chunk(2, dim=-1)
        act = (F.silu(gate.float()) * lin.float()).to(x.dtype)
        out = torch.empty(tokens, 1, self.w2.shape[1], dtype=x.dtype, device=x.device)
        self.invoke(act, self.w2, None, out, None, s2, None, topk_w, topk_ids, *aligned, True, 1, down, compute,
                    **quant)
        return out
