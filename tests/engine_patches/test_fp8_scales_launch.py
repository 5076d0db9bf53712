"""`capbench sglang-launch --kv-scales / --record-kv-amax`: flags, checks, and the patches reaching a fresh
interpreter started with the launcher's environment (what SGLang's spawned schedulers are)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from engine_patches.fp8_scales.scales_file import build_scales, write_scales
from engine_patches.launch import PatchOptions, build_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHVISION_OPS = textwrap.dedent("""
    import torch
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
""")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def scales_file(tmp_path):
    return write_scales(build_scales("mha", {0: (10.0, 5.0), 1: (900.0, 40.0)}, 2, 1), tmp_path / "kv.json")


def test_dry_run_passes_the_scales_to_sglang(scales_file):
    r = cli("sglang-launch", "--kv-scales", str(scales_file), "--dry-run", "--", "--model-path", "zai-org/GLM-4.6",
            "--kv-cache-dtype", "fp8_e4m3")
    assert r.returncode == 0, r.stderr
    assert f"--kv-cache-dtype fp8_e4m3 --quantization-param-path {scales_file}" in r.stdout
    assert "fp8_kv_scales: on" in r.stdout and "kv_amax_recorder: off" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("CAPBENCH_PATCHES="))
    assert json.loads(line.split("=", 1)[1])["kv_scales"] == str(scales_file)


@pytest.mark.parametrize("args,message", [
    (["--kv-scales", "{f}", "--", "--kv-cache-dtype", "auto"], "needs --kv-cache-dtype fp8_e4m3"),
    (["--kv-scales", "/nonexistent.json", "--", "--kv-cache-dtype=fp8_e4m3"], "file not found"),
    (["--kv-scales", "{f}", "--", "--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", "x"], "drop yours"),
    (["--kv-scales", "{f}", "--record-kv-amax", "/tmp/a"], "exclude each other"),
    (["--record-kv-amax", "/tmp/a", "--", "--kv-cache-dtype", "fp8_e4m3"], "calibrates on a BF16 KV cache"),
    (["--record-kv-amax", "/nonexistent/dir/amax"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(scales_file, args, message):
    r = cli("sglang-launch", *[a.format(f=scales_file) for a in args], "--dry-run")
    assert r.returncode == 2, r.stdout
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def run_with_launcher_env(options: PatchOptions, code: str, tmp_path) -> subprocess.CompletedProcess:
    _, env = build_command(options, [])
    env["CAPBENCH_KV_AMAX_INTERVAL_S"] = "0"
    script = tmp_path / "child.py"
    script.write_text(TORCHVISION_OPS + textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)


def test_recorder_reaches_a_fresh_process(tmp_path):
    amax = tmp_path / "amax"
    r = run_with_launcher_env(PatchOptions(record_kv_amax=str(amax)), """
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        pool = MHATokenToKVPool(64, 16, torch.bfloat16, 1, 16, 2, "cpu", False)
        for layer in range(2):
            k = torch.full((4, 1, 16), 3.0 + layer, dtype=torch.bfloat16)
            pool.set_kv_buffer(RadixAttention(1, 16, 0.25, 1, layer_id=layer), torch.arange(16, 20), k, -2 * k)
    """, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dump = json.loads((tmp_path / "amax.rank0.json").read_text())
    assert dump["layout"] == "mha"
    assert {k: (v["k"], v["v"]) for k, v in dump["layers"].items()} == {"0": (3.0, 6.0), "1": (4.0, 8.0)}


def test_loader_reaches_a_fresh_process(tmp_path, scales_file):
    r = run_with_launcher_env(PatchOptions(kv_scales=str(scales_file)), """
        import sglang.srt.model_executor.model_runner  # the trigger, imported by every SGLang scheduler
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
        from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
        from sglang.srt.models.glm4_moe import Glm4MoeForCausalLM
        print(Glm4MoeForCausalLM.load_kv_cache_scales.__module__, DeepseekV3ForCausalLM.load_kv_cache_scales.__name__,
              MLATokenToKVPool.set_mla_kv_buffer.__module__)
    """, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-3:] == ["engine_patches.fp8_scales.loading", "deepseek_v2_load_kv_cache_scales",
                                     "engine_patches.fp8_scales.loading"]
