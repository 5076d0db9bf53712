"""KV-cache page checksums for SGLang 0.5.23: checksum.py (definition, torch reference), kernel.py (Triton),
seals.py (the per-page seal table), tree.py (SGLang's default unified tree, checked), hicache.py (seals that
follow pages to host memory), hooks.py (seal on fill, admission mark), patch.py (registration), metrics.py,
events.py, gpu_check.py and match_bench.py (measurements)."""
