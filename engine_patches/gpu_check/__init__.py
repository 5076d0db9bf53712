"""`capbench gpu-check` (or `python -m engine_patches.gpu_check`): one command that times, on one GPU, what the
project's speed claims rest on, with the kernels SGLang 0.5.23 runs by default, and says so loudly when it cannot.

Sections (run.py), every figure with its shape and the kernel it came from:
- decode attention, one layer, BF16 vs FP8 KV, Kimi K2 MLA and GLM-4.6 GQA shapes per GPU at TP8, batch 1/32/256
  x context 4k/32k: SGLang's Triton kernel and the backend 0.5.23 picks for the card (FA3 on Hopper for both
  MLA and GQA; FlashInfer elsewhere when installed; kernels.default_decode_backend);
- KV page checksums: the seal each decode step runs, and the admission and insert checks of each request, host
  sync included, as a share of that decode step (attention over all layers), per backend;
- MoE, one layer's local experts at EP8: INT4 W4A16 on Marlin (0.5.23's default on Hopper) and on Triton, and
  BF16 on Triton;
- NVML samples (power, utilisation, memory, SM clock) on the timeline of the cases.
Timing: CUDA events around each call after warm-up calls; host-synchronising checks are timed on the host clock
around the whole call. A kernel that cannot run is an error line naming it (and what it needs, e.g. sgl-kernel),
never replaced by another; the command then exits 1 after writing what it measured.
"""
