"""Routed-expert INT4 (W4A16, compressed-tensors pack-quantized) conversion for GLM-4.x and Kimi K2 checkpoints."""
