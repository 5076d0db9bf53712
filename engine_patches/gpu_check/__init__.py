"""`capbench gpu-check` (or `python -m engine_patches.gpu_check`): one command that times, on one GPU, what SGLang
0.5.23 runs, and says so by name when it cannot.

Sections (run.py), every figure with its shape and the code it came from:
- decode_attention (attention.py): one layer's `forward_decode` of each backend's own SGLang class (built around
  SGLang's KV pool by backends.py, capbench's FP8-scale patches installed as a patched server has them: patched.py),
  BF16 vs FP8 KV, batch 1/32/256 x context 4k/32k. Kimi K2 MLA (8 query heads, latent 512 + rope 64) on fa3,
  flashmla, triton and trtllm_mla; GLM-4.6 GQA (12 query heads, 1 KV head x 128) on fa3, flashinfer, triton and
  trtllm_mha; each where data/attention_backends.yaml says it runs. The pool is a server's KV pool on this GPU at
  TP8 (the CLI's --context), so fa3's whole-layer FP8 upcast is timed at its real size;
- checksum (checksums.py): what KV page checksums cost a decode step, as a share of each backend's step;
- moe (moe.py): one MoE layer's local experts at EP8 over 1-8k tokens, BF16, FP8 block-128 and INT4 W4A16 g32 on
  SGLang's Triton kernel, INT4 on Marlin;
- NVML samples (power, utilisation, memory, SM clock) on the timeline of the cases.
The figures are also written as kernel-table rows (tables.py); `capbench gpu-check-merge` adds them to data/kernels.
Timing: CUDA events around each call after warm-up calls, replayed from a CUDA graph as SGLang decodes (eager when
capture fails, which the row says). A case that cannot run is one error line for its (kernel, model, KV dtype or
format), never replaced by another kernel; the others still run and the command exits 1.
"""
