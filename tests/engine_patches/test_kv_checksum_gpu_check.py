"""The GPU check script's logic, run on CPU with tiny sizes (the Triton kernel interpreted)."""

import json

import pytest

from engine_patches.kv_checksum import gpu_check


def test_gpu_check_runs_on_cpu_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "kv_checksum_gpu.json"
    # the smallest pool (8 pages a shape): the interpreted kernel sweeps every page of it (the sizes are not under
    # test; the 4k-token verify, 64 pages, is most of the time)
    gpu_check.main(["--device", "cpu", "--quick", "--pool-gib", "0.0001", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["quick"] and data["triton_interpret"] and data["all_bit_identical"]
    assert [(r["pool"].split()[0], r["kv_dtype"]) for r in data["pools"]] == [
        ("kimi-k2", "bf16"), ("kimi-k2", "fp8_e4m3"), ("glm-4.6", "bf16"), ("glm-4.6", "fp8_e4m3")]
    for r in data["pools"]:
        assert r["kernel_gbps"] > 0 and r["verify_4k_tokens_ms"] > 0
        assert r["kernel_vs_copy"] == pytest.approx(r["kernel_gbps"] / data["copy_gbps"])
        assert [(s["batch"], s["context"]) for s in r["steps"]] == [(1, 64), (1, 128), (2, 64), (2, 128)]
        for s in r["steps"]:
            assert s["attention_impl"] == "torch gather+bmm"  # on CPU; on CUDA SGLang's kernel is tried first
            assert s["decode_step_ms"] > 0 and s["seal_ms"] > 0
            assert s["checked_pages_per_step"] == pytest.approx(s["batch"] * (s["context"] + 1024) / 64 / 1024)
            assert s["overhead"] == pytest.approx((s["seal_ms"] + s["checks_ms"]) / s["decode_step_ms"])
        assert r["max_overhead"] == max(s["overhead"] for s in r["steps"])
    assert data["goals"] == {"kernel_vs_copy_min": 0.8, "overhead_vs_decode_step_max": 0.005}
    assert "copy bandwidth" in capsys.readouterr().out


def test_gpu_check_refuses_cuda_without_a_gpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_check.main(["--out", str(tmp_path / "x.json")])
