"""`capbench gpu-check` on the CPU: the same code as on a GPU, tiny shapes, SGLang's Triton kernels under
TRITON_INTERPRET=1. Every figure names its shape and kernel; a kernel that cannot be imported is an error line
naming it and a non-zero exit, and no other implementation is timed in its place. (GPU figures: pending, no GPU.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_patches.gpu_check import report
from engine_patches.gpu_check.kernels import default_decode_backend, default_w4a16_moe_backend

CAPBENCH = Path(sys.executable).parent / "capbench"
ROOT = Path(__file__).resolve().parents[2]
# `capbench` itself, in a process that first defines torchvision's two op schemas (tests/conftest.py): this CPU
# set-up pairs CPU torch with PyPI's CUDA torchvision, which SGLang's kernel modules import through transformers.
CAPBENCH_CPU_TORCH = [sys.executable, "-c", "import sys, tests.conftest; from bench.cli import main; "
                      "sys.argv[0] = 'capbench'; main()"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu") / "gpu_check.json"
    p = subprocess.run([*CAPBENCH_CPU_TORCH, "gpu-check", "--quick", "--out", str(out)], capture_output=True,
                       text=True, timeout=900, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"})
    return p, json.loads(out.read_text()) if out.is_file() else {}


def test_quick_run_times_every_section_with_shape_and_kernel(quick_run):
    p, doc = quick_run
    assert p.returncode == 0, p.stderr[-2000:]
    assert doc["pending"] is True and doc["errors"] == [] and doc["skipped_for_time"] == []
    attn = doc["decode_attention"]
    assert {(r["model"], r["kv"], r["backend"]) for r in attn} == {
        (m, kv, "triton") for m in ("kimi-k2", "glm-4.6") for kv in ("bf16", "fp8")}
    for section in ("decode_attention", "moe", "checksum"):
        for r in doc[section]:
            assert r["shape"] and r["kernel"] and r["t_end_s"] >= r["t_start_s"]
    for r in attn:
        assert r["kernel"] == "sglang triton decode_attention_fwd" and r["step_ms"] == r["ms_per_layer"] * r["layers"]
    assert {(r["model"], r["backend"], r["weights"]) for r in doc["moe"]} == {
        (m, "triton", w) for m in ("kimi-k2", "glm-4.6") for w in ("bf16", "int4")}
    for ck in doc["checksum"]:
        for s in ck["steps"]:
            assert s["admission_check_ms"] > 0 and "host sync included" in s["checks_timing"]
            expected = s["seal_ms"] + s["batch"] * (s["admission_check_ms"] + s["insert_checks_ms"]) / 64
            assert s["per_step_ms"] == pytest.approx(expected)
    over = doc["checksum_overhead"]
    assert len(over) == 4 and all(o["share"] == pytest.approx(o["checksum_ms"] / o["decode_step_ms"]) for o in over)
    assert [e["section"] for e in doc["timeline"]].count("decode_attention") == len(attn)
    assert "PENDING: not GPU figures" in p.stdout and "sglang triton decode_attention_fwd" in p.stdout


def test_a_kernel_that_fails_to_import_is_an_error_not_a_fallback(tmp_path, monkeypatch, capsys):
    """SGLang's Triton decode kernel made unimportable: the attention rows are missing, the error names the
    kernel, the exit is 1, and no decode step (torch or other) stands in for the checksum overhead."""
    monkeypatch.setitem(sys.modules, "sglang.kernels.ops.attention.decode_attention", None)
    monkeypatch.setattr(report, "DEFAULT_OUT", tmp_path / "unused.json")
    out = tmp_path / "g.json"
    code = report.main(["--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert ("ERROR decode_attention: triton_decode (sglang.kernels.ops.attention.decode_attention."
            "decode_attention_fwd) cannot run: ModuleNotFoundError") in err
    assert "1 kernel(s) SGLang would run could not be timed: triton_decode" in err
    doc = json.loads(out.read_text())
    assert doc["decode_attention"] == [] and doc["checksum_overhead"] == []
    assert [e["kernel"] for e in doc["errors"]] == ["triton_decode"]
    assert doc["moe"] and doc["checksum"]  # the other sections still ran and were written


def test_without_a_gpu_the_figures_stay_pending_in_one_line(tmp_path):
    p = subprocess.run([str(CAPBENCH), "gpu-check", "--out", str(tmp_path / "g.json")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "no CUDA device: the GPU figures stay pending (no GPU lent)" in p.stderr
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("args", [["--budget-s", "0"], ["--budget-s", "nan"], ["--out", "/proc/no/such/g.json"]])
def test_bad_options_are_one_line(args):
    p = subprocess.run([str(CAPBENCH), "gpu-check", "--quick", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr


def test_sglang_0_5_23_defaults():
    assert default_decode_backend("mla", (9, 0), flashinfer=True) == "fa3"  # Hopper: FA3 for MLA and GQA
    assert default_decode_backend("gqa", (9, 0), flashinfer=True) == "fa3"
    assert default_decode_backend("mla", (10, 0), flashinfer=True) == "flashinfer"
    assert default_decode_backend("gqa", (8, 0), flashinfer=True) == "flashinfer"
    assert default_decode_backend("gqa", (8, 0), flashinfer=False) == "triton"
    assert default_w4a16_moe_backend((9, 0)) == "marlin" and default_w4a16_moe_backend((10, 0)) == "triton"
