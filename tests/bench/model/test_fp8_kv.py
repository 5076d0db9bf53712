"""FP8 KV's two effects per backend: the pool it doubles and the step time the backend's kernel table gives it."""

import pytest

from bench.model import catalog, fp8_kv
from bench.model.fits.capacity import Deployment


def test_kimi_on_h200_fa3_buys_pool_and_costs_step_time():
    dep = Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8)
    by = {e.backend: e for e in fp8_kv.effects(dep)}
    assert set(by) == {"fa3", "flashmla", "flashinfer", "triton"}
    fa3 = by["fa3"]
    assert fa3.pool_ratio == pytest.approx(2.0, rel=0.02) and fa3.step_ratio > 1.3
    assert fa3.priced_by == "kernel tables"
    said = "no kernel measurement for flashmla MLA decode with fp8_e4m3 KV on h200: roofline"
    assert said in by["flashmla"].priced_by
    assert fa3.words().startswith("FP8 KV on fa3: 2.00x the KV pool; a decode step of ")


def test_glm_on_h200_fa3_reads_fp8_at_parity():
    dep = Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8)
    fa3 = next(e for e in fp8_kv.effects(dep) if e.backend == "fa3")
    assert fa3.step_ratio == pytest.approx(1.0, abs=0.08) and fa3.throughput_ratio > 1.2
