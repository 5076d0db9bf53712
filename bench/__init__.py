"""capbench: capacity, throughput and cost planning for MoE models on SGLang."""

__version__ = "0.1.0"
