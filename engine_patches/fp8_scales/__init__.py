"""Calibrated per-layer FP8 (e4m3) KV-cache scales for GLM-4.x (MHA) and Kimi K2 (MLA) on SGLang 0.5.23."""
