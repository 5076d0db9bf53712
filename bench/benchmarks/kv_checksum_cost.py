"""KV page checksum costs on this CPU: seal per decode step, a check's cost, the HiCache host-copy check; medians
and ratios printed by one run. The measuring code needs SGLang's pools and lives beside the patch
(engine_patches/kv_checksum/cost_bench.py); it runs here in a process of its own, as the CLI reaches engine_patches.

    .venv/bin/python bench/benchmarks/kv_checksum_cost.py [--layers 4] [--reps 7] [--page-size 64]
"""

from __future__ import annotations

import subprocess
import sys

if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "engine_patches.kv_checksum.cost_bench", *sys.argv[1:]]))
