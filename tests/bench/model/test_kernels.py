"""The kernel tables load with their provenance, and a lookup reproduces a measured point, interpolates between
points monotonically, says which SGLang version priced it, and answers None where nothing was measured."""

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from bench.model import kernels as K
from bench.model.fits.catalog import models

TABLES = ("attention", "moe", "gemm", "comm")


@pytest.fixture(scope="module")
def sources():
    return yaml.safe_load((K.KERNELS / "sources.yaml").read_text())


def test_every_table_row_set_has_its_provenance(sources):
    src = sources["source"]
    assert src["repository"] == "github.com/ai-dynamo/aiconfigurator"
    assert src["commit"].startswith("095f58a51") and src["licence"] == "Apache-2.0" and "NVIDIA" in src["notice"]
    listed = {(v["gpu"], v["op"], v["sglang"]) for v in sources["versions"]}
    for name in TABLES:
        t = pq.read_table(K.KERNELS / f"{name}.parquet")
        assert sources["files"][f"{name}.parquet"] == t.num_rows
        pairs = set(zip(t["gpu"].to_pylist(), t["sglang"].to_pylist(), strict=True))
        assert pairs and all((g, name, v) in listed for g, v in pairs)
    for v in sources["versions"]:
        for table in v["tables"].values():
            assert table["path"].startswith(src["root"]) and table["rows_kept"] <= table["rows_read"]


def test_the_tables_cover_the_five_nvidia_gpus_and_stay_small():
    gpus = set(pq.read_table(K.KERNELS / "attention.parquet")["gpu"].to_pylist())
    assert gpus == {"h100-sxm", "h200", "b200", "gb200", "b300"}
    assert sum((K.KERNELS / f"{n}.parquet").stat().st_size for n in TABLES) < 5e6


def _row(name: str, **eq) -> dict:
    t = pq.read_table(K.KERNELS / f"{name}.parquet")
    for c, v in eq.items():
        t = t.filter(pc.equal(t[c], v))
    return t.slice(0, 1).to_pylist()[0]


def test_an_exact_grid_point_returns_the_measured_latency():
    kimi = models()["kimi-k2-thinking"]
    r = _row("attention", gpu="h200", sglang="0.5.14", attention="mla", phase="decode", backend="fa3",
             kv_dtype="fp8_e4m3", heads=8, batch=32, length=32768)
    s, said = K.attention_time(kimi, "h200", "fa3", "fp8_e4m3", "decode", 32, 32768, 8, "0.5.14")
    assert s == pytest.approx(r["latency_ms"] * 1e-3, rel=1e-6) and "extrapolated" not in said
    m = _row("moe", gpu="h200", sglang="0.5.14", dtype="int4_wo", hidden=7168, experts=384, moe_tp=8, moe_ep=1,
             tokens=512, kernel="sglang_marlin_moe")
    s, said = K.moe_time(kimi, "h200", "int4-g32", 512, 1, 8, "0.5.14")
    assert s == pytest.approx(m["latency_ms"] * 1e-3, rel=1e-6) and "marlin" in said


def test_the_published_fa3_fp8_mla_penalty_is_what_a_plan_reads():
    """H200, SGLang 0.5.14, 8 heads, batch 32 x 32k: 0.29 ms a layer with BF16 KV, 2.04 ms with FP8 on fa3."""
    kimi = models()["kimi-k2-thinking"]
    bf16, _ = K.attention_time(kimi, "h200", "fa3", "bf16", "decode", 32, 32768, 8, "0.5.14")
    fp8, _ = K.attention_time(kimi, "h200", "fa3", "fp8_e4m3", "decode", 32, 32768, 8, "0.5.14")
    assert bf16 * 1e3 == pytest.approx(0.29, abs=0.01) and fp8 * 1e3 == pytest.approx(2.04, abs=0.01)


def test_interpolation_is_monotonic_between_measured_points():
    kimi = models()["kimi-k2-thinking"]
    times = [K.moe_time(kimi, "h200", "fp8-block128", t, 1, 8, "0.5.14")[0] for t in range(512, 1025, 16)]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))
    ctx = [K.attention_time(kimi, "h200", "fa3", "bf16", "decode", 16, n, 8, "0.5.14")[0]
           for n in range(4096, 8193, 256)]
    assert all(a <= b for a, b in zip(ctx, ctx[1:], strict=False))


def test_the_version_is_the_nearest_not_newer_and_said():
    kimi = models()["kimi-k2-thinking"]
    assert K.resolve("h200", "attention", "0.5.23") == ("0.5.14", "SGLang 0.5.23 priced on 0.5.14's table")
    assert K.resolve("h200", "attention", "0.5.12")[0] == "0.5.10"
    assert K.resolve("h200", "attention", "0.5.9") == ("0.5.9", "")
    v, said = K.resolve("h200", "moe", "0.4.6")
    assert v == "0.5.9" and "no table as old as SGLang 0.4.6" in said
    _, said = K.moe_time(kimi, "b200", "fp8-block128", 64, 1, 8)
    assert "SGLang 0.5.23 priced on 0.5.14's table" in said


def test_no_table_answers_none_and_a_borrowed_shape_is_said():
    kimi, glm = models()["kimi-k2-thinking"], models()["glm-4.6"]
    assert K.moe_time(kimi, "mi300x", "int4-g32", 64, 1, 8) is None
    assert K.attention_time(kimi, "h200", "flashmla", "fp8_e4m3", "decode", 8, 4096, 8) is None
    assert K.no_table("INT4 MoE on mi300x") == "no kernel measurement for INT4 MoE on mi300x: roofline"
    s, said = K.moe_time(glm, "h200", "bf16", 256, 1, 8, "0.5.14")
    assert s > 0 and "scaled from the measured 4096x1536 x 128 experts shape" in said
    _, said = K.attention_time(kimi, "h200", "fa3", "bf16", "decode", 32, 400_000, 8, "0.5.14")
    assert "extrapolated" in said
