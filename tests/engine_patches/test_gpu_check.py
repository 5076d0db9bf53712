"""`capbench gpu-check` on the CPU: the same code as on a GPU, tiny shapes, SGLang's Triton kernels under
TRITON_INTERPRET=1, the CUDA-only backends and Marlin not tried. Every figure names its shape and kernel; a kernel that
cannot run is one error line for its (kernel, model, KV dtype or format) and every other scope still runs; the
figures come out as kernel-table Parquet. (GPU figures: pending, no GPU.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine_patches.gpu_check import report, tables

CAPBENCH = Path(sys.executable).parent / "capbench"
ROOT = Path(__file__).resolve().parents[2]
# `capbench` itself, in a process that first defines torchvision's two op schemas (tests/conftest.py): this CPU
# set-up pairs CPU torch with PyPI's CUDA torchvision, which SGLang's kernel modules import through transformers.
CAPBENCH_CPU_TORCH = [sys.executable, "-c", "import sys, tests.conftest; from bench.cli import main; "
                      "sys.argv[0] = 'capbench'; main()"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    folder = tmp_path_factory.mktemp("gpu")
    out = folder / "gpu_check.json"
    p = subprocess.run([*CAPBENCH_CPU_TORCH, "gpu-check", "--quick", "--out", str(out)], capture_output=True,
                       text=True, timeout=1500, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"})
    return p, json.loads(out.read_text()) if out.is_file() else {}, folder


def test_quick_run_times_every_section_with_shape_and_kernel(quick_run):
    p, doc, _ = quick_run
    assert p.returncode == 0, p.stderr[-2000:]
    assert doc["pending"] is True and doc["errors"] == [] and doc["skipped_for_time"] == []
    attn = doc["decode_attention"]
    assert {(r["model"], r["kv"], r["backend"]) for r in attn} == {
        (m, kv, "triton") for m in ("kimi-k2", "glm-4.6") for kv in ("bf16", "fp8")}
    for r in attn:
        assert r["kernel"] == "TritonAttnBackend.forward_decode -> decode_attention_fwd (Triton)"
        assert r["step_ms"] == r["ms_per_layer"] * r["layers"] and r["pool_tokens"] >= r["batch"] * r["context"]
    assert {(r["model"], r["weights"]) for r in doc["moe"]} == {
        (m, w) for m in ("kimi-k2", "glm-4.6") for w in ("bf16", "fp8", "int4")}
    for section in ("decode_attention", "moe", "checksum"):
        for r in doc[section]:
            assert r["shape"] and r["kernel"] and r["t_end_s"] >= r["t_start_s"]
    # the CUDA-only kernels are said to be not tried, by name, not timed by something else
    assert {u["kernel"] for u in doc["unavailable"]} == {"fa3", "flashmla", "trtllm_mla", "flashinfer", "trtllm_mha",
                                                         "marlin_moe"}
    assert set(doc["section_s"]) == {"decode_attention", "checksum", "moe"}
    assert "PENDING: not GPU figures" in p.stdout
    # checksum rows: seal + checks per step for each answer length, and the HiCache load-back check
    for ck in doc["checksum"]:
        assert {r["answer_tokens"] for r in ck["steps"]} == {16, 64}
        assert [r["tokens"] for r in ck["hicache_loads"]] == [32]
        assert all(r["host_check_ms"] > 0 and r["device_check_ms"] > 0 for r in ck["hicache_loads"])
    assert {r["answer_tokens"] for r in doc["checksum_overhead"]} == {16, 64}
    assert "HiCache load-back: host-copy check" in p.stdout


def test_quick_run_writes_the_kernel_tables(quick_run):
    """attention.parquet and moe.parquet beside the JSON, in the kernel tables' columns and then the provenance."""
    _, doc, folder = quick_run
    for name, schema in (("attention", tables.ATTENTION), ("moe", tables.MOE)):
        t = pq.read_table(folder / "gpu_check_tables" / f"{name}.parquet")
        assert t.schema.names == schema + tables.PROVENANCE + tables.EXTRA[name]
        rows = t.to_pylist()
        assert rows == [{k: pytest.approx(v) if isinstance(v, float) else v for k, v in r.items()}
                        for r in doc["kernel_tables"][name]]
        assert {r["source"] for r in rows} == {"capbench gpu-check"} and {r["gpu"] for r in rows} == {"cpu"}
    attn = pq.read_table(folder / "gpu_check_tables" / "attention.parquet").to_pylist()
    assert {(r["attention"], r["kv_dtype"], r["phase"]) for r in attn} == {
        (a, kv, "decode") for a in ("mla", "gqa") for kv in ("bf16", "fp8_e4m3")}
    moe = pq.read_table(folder / "gpu_check_tables" / "moe.parquet").to_pylist()
    assert {(r["dtype"], r["format"]) for r in moe} == {("bfloat16", "bf16"), ("fp8_block", "fp8-block128"),
                                                        ("int4_wo", "int4-g32")}
    assert all(r["moe_ep"] == 8 and r["topk"] == 8 and r["distribution"] == "balanced" for r in moe)


def test_a_kernel_that_fails_to_import_is_an_error_not_a_fallback(tmp_path, monkeypatch, capsys):
    """SGLang's Triton backend made unimportable: an error per (model, KV dtype) naming the module and its import
    error, the exit is 1, no other kernel is timed in its place, and the other sections still ran."""
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.attention.triton_backend", None)
    out = tmp_path / "g.json"
    code = report.main(["--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert ("ERROR decode_attention [triton_decode kimi-k2 bf16]: triton_decode (sglang.srt.layers.attention."
            "triton_backend.TritonAttnBackend) cannot run: ModuleNotFoundError") in err
    doc = json.loads(out.read_text())
    assert doc["decode_attention"] == [] and doc["checksum_overhead"] == []
    assert sorted(tuple(e["scope"]) for e in doc["errors"]) == [
        ("glm-4.6", "bf16"), ("glm-4.6", "fp8"), ("kimi-k2", "bf16"), ("kimi-k2", "fp8")]
    assert doc["moe"] and doc["checksum"]


def test_without_a_gpu_the_figures_stay_pending_in_one_line(tmp_path):
    p = subprocess.run([str(CAPBENCH), "gpu-check", "--out", str(tmp_path / "g.json")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "no CUDA device: the GPU figures stay pending (no GPU lent)" in p.stderr
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("args", [["--budget-s", "0"], ["--budget-s", "nan"], ["--out", "/proc/no/such/g.json"],
                                  ["--tables", "/proc/no/such"]])
def test_bad_options_are_one_line(args):
    p = subprocess.run([str(CAPBENCH), "gpu-check", "--quick", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
