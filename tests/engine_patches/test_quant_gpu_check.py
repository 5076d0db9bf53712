"""The quant GPU check on the CPU with tiny shapes: the kernels it times compute attention, and the JSON it writes
has the shape the performance model reads. (The H200 figures are pending: no GPU here.)"""

import json
import math

import torch

from engine_patches import quant_gpu_check as gc


def torch_decode(inp: dict) -> torch.Tensor:
    """Plain softmax attention over each request's (scattered) tokens, descaled like SGLang's FP8 path."""
    q, k_buf, v_buf = inp["q"].float(), inp["k_buffer"].float() * inp["scale"], inp["v_buffer"].float() * inp["scale"]
    out = []
    for b in range(q.shape[0]):
        idx = inp["kv_indices"][inp["kv_indptr"][b]:inp["kv_indptr"][b + 1]].long()
        k, v = k_buf[idx, 0], v_buf[idx, 0]  # one kv head
        p = torch.softmax(q[b] @ k.T * q.shape[-1] ** -0.5, dim=-1)
        out.append(p @ v)
    return torch.stack(out)


def test_timed_kernels_compute_attention():
    for name in ("glm-4.6", "kimi-k2"):
        inp = gc.decode_inputs(gc.TINY_ATTN[name], 64, 2, "bf16", torch.float16, torch.device("cpu"), 2)
        got = gc.decode(inp).float()
        ref = torch_decode(inp)
        assert float((got - ref).norm() / ref.norm()) < 5e-3, name


def test_tiny_run_writes_the_documented_json(tmp_path):
    out = tmp_path / "quant_gpu_cpu.json"
    gc.run_check(tiny=True, out_path=out)
    doc = json.loads(out.read_text())
    assert doc["pending"] is True and doc["gpu"].startswith("none") and doc["factors"] is None
    assert {"measured_at", "versions", "dtype", "note"} <= set(doc) and doc["skipped_for_time"] == []
    attn = doc["decode_attention"]
    assert {(r["model"], r["kv"]) for r in attn} == {(m, k) for m in ("glm-4.6", "kimi-k2") for k in ("bf16", "fp8")}
    for r in attn:
        assert {"ctx", "bs", "kv", "ms", "gbps"} <= set(r) and r["ms"] > 0 and r["gbps"] > 0
        if r["kv"] == "fp8":
            assert r["speedup"] > 0 and 0 <= r["rel_err"] < 1
    moe = doc["moe_gemm"]
    models = ("glm-4.6", "kimi-k2")
    assert {(r["model"], r["weights"]) for r in moe} == {(m, w) for m in models for w in ("bf16", "int4")}
    for r in moe:
        assert {"m", "experts", "hidden", "inter", "top_k", "ms", "gbps"} <= set(r)
        if r["weights"] == "int4":
            assert r["speedup"] > 0 and r["rel_err"] < 0.3  # INT4 g32 of gaussian weights: ~0.1-0.15
    for key in ("fp8_kv_speedup", "int4_moe_speedup"):
        assert set(doc[key]) == {"glm-4.6", "kimi-k2", "overall"} and math.isfinite(doc[key]["overall"])


def test_factors_for_the_performance_model():
    attn = [{"ctx": 4096, "bs": 8, "gbps": 3000.0}, {"ctx": 131072, "bs": 32, "gbps": 3600.0},
            {"ctx": 131072, "bs": 32, "gbps": 4000.0}]
    moe = [{"model": "kimi-k2", "m": 256, "weights": "bf16", "ms": 2.0},
           {"model": "kimi-k2", "m": 256, "weights": "int4", "ms": 2.5},
           {"model": "kimi-k2", "m": 1, "weights": "int4", "ms": 0.1}]
    f = gc.factors("NVIDIA H200", attn, moe)
    assert f["hbm_eff"] == 3800.0 / 4800.0 and f["int4_dequant_factor"] == 1.25
    assert gc.factors("NVIDIA L4", attn, moe) is None
