"""What capbench changes inside SGLang 0.5.23. Imports sglang/torch/triton; only the CLI reaches it, lazily."""

SGLANG_VERSION = "0.5.23"
