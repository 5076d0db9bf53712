"""The main job on a laptop: what FP8 KV and INT4 experts buy Kimi K2 Thinking and GLM-4.6 on 8x H200."""

from __future__ import annotations

from bench import capacity as cap
from bench import catalog
from bench.capacity_table import compare_table, print_tables

DEMO_DEPLOYMENTS = [("kimi-k2-thinking", "h200", 8), ("glm-4.6", "h200", 8)]


def run_demo() -> None:
    tables = []
    for model_id, gpu_id, tp in DEMO_DEPLOYMENTS:
        dep = cap.Deployment(catalog.model(model_id), catalog.gpu(gpu_id), tp, page_size=64)
        tables.append(compare_table(cap.compare(dep)))
    print_tables(*tables)
