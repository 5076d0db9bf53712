"""KV-cache page checksums for SGLang 0.5.23: checksum.py (definition, torch reference), kernel.py (Triton),
radix.py (the checksummed RadixCache), patch.py (registration), metrics.py, events.py, gpu_check.py."""
