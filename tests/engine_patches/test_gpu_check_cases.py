"""What `capbench gpu-check` tries and what it times, on the CPU:

- a failure is scoped to its (kernel, model, KV dtype or format): FA3's refusal of an FP8 query at head-dim-V 512 (what
  the old check hit) leaves every GLM fa3 case, Kimi's BF16 fa3 cases and the Marlin MoE cases tried (the sections run
  with stand-ins that record each case in place of the CUDA-only kernels);
- the call it times is the backend's own forward_decode and computes attention (Triton, which runs here: its output
  against a float32 reference over the pool and request layout the call read);
- the CLI gives it each model's server KV pool on the card, and `gpu-check-merge` adds a run to data/kernels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from engine_patches.gpu_check import attention, moe, run
from engine_patches.gpu_check.patched import Patches, sglang_runtime
from tests.engine_patches.attention_harness import gqa_reference, mla_reference, rel_err

CAPBENCH = Path(sys.executable).parent / "capbench"
FA3_REFUSAL = "HeaddimV > 256 requires fp16 and bf16 data type"  # FA3's check for an FP8 query at V dim 512


class StandInPool:
    def __init__(self, shape, kv, tokens, device, half):
        self.tokens, self.half, self.scale = tokens, half, 1.0 if kv == "fp8" else None


def test_a_failure_is_scoped_to_its_kernel_model_and_kv_dtype(monkeypatch, capsys):
    tried = []

    def prepare(name, model, shape, pool, bs, ctx, device, patches, default_page):
        kv = "fp8" if pool.scale else "bf16"
        tried.append((name, model, kv, bs, ctx))
        if (name, model, kv) == ("fa3", "kimi-k2", "fp8"):
            raise RuntimeError(FA3_REFUSAL)
        return (lambda: None), f"stand-in {name}"

    monkeypatch.setattr(attention, "runnable", lambda kind, arch: list(attention.BACKENDS[kind]))
    monkeypatch.setattr(attention, "Pool", StandInPool)
    monkeypatch.setattr(attention, "prepare", prepare)
    c = run.Check(torch.device("cpu"), quick=False, budget_s=600)
    specs = run.models(quick=False)
    sizes = {**run.FULL, "warmup": 0, "iters": 1}
    run.attention_section(c, specs, sizes, torch.bfloat16, "sm90", {})
    shapes = [(bs, ctx) for bs in sizes["batches"] for ctx in sizes["contexts"]]
    assert [e["kernel"] for e in c.errors] == ["fa3"] and c.errors[0]["scope"] == ["kimi-k2", "fp8"]
    assert FA3_REFUSAL in c.errors[0]["error"] and c.errors[0]["cases_not_tried"] == len(shapes) - 1
    for kv in ("bf16", "fp8"):
        assert [t[3:] for t in tried if t[:3] == ("fa3", "glm-4.6", kv)] == shapes  # every GLM fa3 case
        for name in ("flashmla", "triton", "trtllm_mla"):
            assert [t[3:] for t in tried if t[:3] == (name, "kimi-k2", kv)] == shapes
    assert [t[3:] for t in tried if t[:3] == ("fa3", "kimi-k2", "bf16")] == shapes
    assert [t[3:] for t in tried if t[:3] == ("fa3", "kimi-k2", "fp8")] == shapes[:1]  # tried once, then not
    assert len(c.rows["decode_attention"]) == 2 * 2 * 4 * len(shapes) - len(shapes)
    err = capsys.readouterr().err
    assert err.count("ERROR") == 1
    assert f"ERROR decode_attention [fa3 kimi-k2 fp8]: fa3: RuntimeError: {FA3_REFUSAL}" in err

    made, timed = [], []

    class StandInExperts:
        def __init__(self, shape, fmt, half, device):
            made.append((shape, fmt))

        def call(self, tokens):
            timed.append((made[-1][1], made[-1][0], tokens))
            return lambda: None

    monkeypatch.setattr(moe, "Experts", StandInExperts)
    run.moe_section(c, specs, sizes, torch.bfloat16, ["bf16", "fp8", "int4", "int4-marlin"])
    for spec in specs.values():
        assert [t[2] for t in timed if t[:2] == ("int4-marlin", spec["moe"])] == sizes["moe_tokens"]
    assert {r["kernel"] for r in c.rows["moe"] if r["weights"] == "int4-marlin"} == {"sglang_marlin_moe"}
    assert len(c.rows["moe"]) == 2 * 4 * len(sizes["moe_tokens"]) and len(c.errors) == 1


def test_the_budget_stops_cleanly_and_lists_what_it_skipped(monkeypatch):
    monkeypatch.setattr(attention, "runnable", lambda kind, arch: ["triton"])
    monkeypatch.setattr(attention, "Pool", StandInPool)
    monkeypatch.setattr(attention, "prepare", lambda *a: ((lambda: None), "stand-in"))
    c = run.Check(torch.device("cpu"), quick=False, budget_s=1e-9)
    run.attention_section(c, run.models(quick=False), {**run.FULL, "warmup": 0, "iters": 1}, torch.bfloat16, "sm90",
                          {})
    assert c.rows["decode_attention"] == [] and c.errors == []
    assert len(c.skipped) == 2 * 2 * 6 * 2  # per model, KV dtype and batch x context: its pool, its case
    assert c.skipped[1] == "decode_attention: kimi-k2 triton 8q/1kv x 512+64, bs 1, ctx 4096, bf16 KV"


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("model", ["kimi-k2", "glm-4.6"])
def test_the_timed_call_is_the_backends_forward_decode_and_computes_attention(model, kv):
    """Triton's forward_decode as gpu-check times it (the kernel under the interpreter, fp16 for its 16-bit KV),
    against attention in float32 over the pool's rows the requests hold (the new token written by the call)."""
    shape, dev = attention.TINY[model], torch.device("cpu")
    with sglang_runtime(), Patches() as patches:
        pool = attention.Pool(shape, kv, 1024, dev, torch.float16)
        call, kernel = attention.prepare("triton", model, shape, pool, 3, 40, dev, patches, 1)
        out = call().float()
    assert kernel == "TritonAttnBackend.forward_decode -> decode_attention_fwd (Triton)"
    layout, ((q, *_), _) = call.layout, call.inputs
    s = pool.scale or 1.0
    if kv == "fp8":  # SGLang's Triton decode kernels cast the query to the KV dtype, unscaled (decode_attention.py:
        q = q.float().to(torch.float8_e4m3fn).float()  # "q_k = q.to(K_Buffer.dtype.element_ty)"), on a GPU too
    if shape.kind == "mla":
        rows = pool.pool.kv_buffer[0].view(pool.pool.dtype).float() * s
        ref = mla_reference(q[..., :shape.v_dim], q[..., shape.v_dim:], rows[..., :shape.v_dim],
                            rows[..., shape.v_dim:], layout, shape.scaling)
    else:
        keys = pool.pool.k_buffer[0].view(pool.pool.dtype).float() * s
        values = pool.pool.v_buffer[0].view(pool.pool.dtype).float() * s
        ref = gqa_reference(q, keys, values, layout, shape.scaling)
    # the CPU interpreter rounds that cast wrongly (docs/engine-patches.md): FP8 outputs are only checked to be the
    # attention and not a mis-scaled one (a missing or doubled descale is off by ~1)
    bound = 0.3 if kv == "fp8" else 1e-2
    assert rel_err(out.view(ref.shape), ref) < bound
    assert layout.pool_size() <= pool.tokens + 64 and len(set(layout.all_slots().tolist())) == 3 * 41


def test_the_cli_sizes_each_models_pool_as_a_server_on_the_card():
    from bench.cli.gpu import catalog_gpu, gpu_context

    assert catalog_gpu("NVIDIA H200") == "h200" and catalog_gpu("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert catalog_gpu("NVIDIA L4") is None
    h200 = gpu_context("h200")["models"]
    for m in ("kimi-k2", "glm-4.6"):
        bf16, fp8 = h200[m]["pool_tokens"]["bf16"], h200[m]["pool_tokens"]["fp8"]
        assert 1.9 < fp8 / bf16 < 2.1 and bf16 > 100_000  # FP8 halves the bytes of a token
        assert h200[m]["default"] == "fa3"
    assert h200["kimi-k2"]["launch"] == {"bf16": "fa3", "fp8": "flashmla"}  # FP8 MLA avoids fa3's upcast
    b200 = gpu_context("b200")["models"]
    assert b200["kimi-k2"]["default"] == "trtllm_mla" and b200["glm-4.6"]["default"] == "trtllm_mha"


def gpu_run(tmp_path: Path, gpu: str, latency: float) -> Path:
    """A gpu-check JSON as a GPU run writes it (two attention rows, one MoE row)."""
    prov = {"device": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "measured_at": "2026-12-06T00:00:00+00:00",
            "source": "capbench gpu-check", "timing": "cuda events, cuda graph replay"}
    attn = [{"gpu": gpu, "sglang": "0.5.23", "attention": a, "phase": "decode", "kernel": "k", "backend": "fa3",
             "kv_dtype": "fp8_e4m3", "heads": 8, "kv_heads": 1, "batch": 32, "length": 32768, "latency_ms": latency,
             **prov, "pool_tokens": 1551936} for a in ("mla", "gqa")]
    experts = [{"gpu": gpu, "sglang": "0.5.23", "kernel": "sglang_marlin_moe", "dtype": "int4_wo",
                "format": "int4-g32", "hidden": 7168, "inter": 2048, "experts": 384, "topk": 8, "moe_tp": 1,
                "moe_ep": 8, "distribution": "balanced", "tokens": 1024, "latency_ms": latency, **prov}]
    path = tmp_path / f"run-{latency}.json"
    path.write_text(json.dumps({"pending": False, "device": "NVIDIA H200", "versions": {"sglang": "0.5.23"},
                                "measured_at": prov["measured_at"],
                                "kernel_tables": {"attention": attn, "moe": experts}}))
    return path


def test_merge_adds_a_run_to_the_kernel_tables_and_a_newer_run_replaces_it(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    published = pa.table({"gpu": ["h200"], "sglang": ["0.5.14"], "attention": ["mla"], "phase": ["decode"],
                          "kernel": ["flash_attention"], "backend": ["fa3"], "kv_dtype": ["fp8_e4m3"],
                          "heads": pa.array([8], pa.int32()), "kv_heads": pa.array([1], pa.int32()),
                          "batch": pa.array([32], pa.int32()), "length": pa.array([32768], pa.int32()),
                          "latency_ms": pa.array([2.04], pa.float32())})
    pq.write_table(published, kernels / "attention.parquet")
    (kernels / "sources.yaml").write_text(yaml.safe_dump({"versions": [{"gpu": "h200", "op": "mla",
                                                                         "sglang": "0.5.14"}]}))
    for latency in (1.5, 0.75):
        p = subprocess.run([str(CAPBENCH), "gpu-check-merge", str(gpu_run(tmp_path, "h200", latency)), "--kernels",
                            str(kernels)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    attn = pq.read_table(kernels / "attention.parquet")
    assert attn.schema.names == published.schema.names
    rows = attn.to_pylist()
    assert [(r["sglang"], r["attention"], r["latency_ms"]) for r in rows] == [
        ("0.5.14", "mla", pytest.approx(2.04)), ("0.5.23", "mla", 0.75), ("0.5.23", "gqa", 0.75)]
    sources = yaml.safe_load((kernels / "sources.yaml").read_text())
    ours = [v for v in sources["versions"] if v["sglang"] == "0.5.23"]
    assert sorted(v["op"] for v in ours) == ["attention", "moe"]
    assert set(next(v for v in ours if v["op"] == "attention")["tables"]) == {"generation_mla", "generation_attention"}
    assert ours[0]["measured_by"]["command"] == "capbench gpu-check"
    kept = pq.read_table(kernels / "gpu_check" / "h200-sglang0.5.23-attention.parquet")
    assert "pool_tokens" in kept.schema.names and "device" in kept.schema.names


def test_merge_refuses_a_cpu_run_in_one_line(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"pending": True, "kernel_tables": {"attention": [], "moe": []}}))
    p = subprocess.run([str(CAPBENCH), "gpu-check-merge", str(path), "--kernels", str(tmp_path / "k")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not GPU figures" in p.stderr
    assert not (tmp_path / "k").exists()
