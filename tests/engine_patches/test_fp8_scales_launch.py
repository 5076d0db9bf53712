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
            "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "fa3")
    assert r.returncode == 0, r.stderr
    assert "--kv-cache-dtype fp8_e4m3 --attention-backend fa3" in r.stdout
    assert r.stdout.rstrip().split("\n")[-3].endswith(f"--quantization-param-path {scales_file}")
    assert "fp8_kv_scales: on" in r.stdout and "kv_amax_recorder: off" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("CAPBENCH_PATCHES="))
    assert json.loads(line.split("=", 1)[1])["kv_scales"] == str(scales_file)


@pytest.mark.parametrize("args,message", [
    (["--kv-scales", "{f}", "--", "--kv-cache-dtype", "auto"], "needs --kv-cache-dtype fp8_e4m3"),
    (["--kv-scales", "/nonexistent.json", "--", "--kv-cache-dtype=fp8_e4m3"], "no such KV scales file"),
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
        from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend  # imported after the trigger
        print(Glm4MoeForCausalLM.load_kv_cache_scales.__module__, DeepseekV3ForCausalLM.load_kv_cache_scales.__name__,
              MLATokenToKVPool.set_mla_kv_buffer.__module__, TRTLLMMLABackend.forward_decode._capbench_scales,
              TRTLLMMLABackend.__mro__[1].forward_extend._capbench_scales)
    """, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-5:] == ["engine_patches.fp8_scales.loading", "deepseek_v2_load_kv_cache_scales",
                                     "engine_patches.fp8_scales.loading", "True", "True"]


# ---- the attention backend the server will run, named or SGLang's default on this host's GPU ----

CAPBENCH = os.path.join(os.path.dirname(sys.executable), "capbench")
KIMI = {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512, "num_key_value_heads": 64}
DEEPSEEK = {**KIMI, "num_key_value_heads": 128}


def fake_gpu(tmp_path, tool: str, output: str) -> dict:
    """A PATH whose nvidia-smi (or rocminfo) answers like that GPU's, and nothing else of the kind."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / tool).write_text(f"#!/bin/sh\necho '{output}'\n")
    (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"}


def launch_in(tmp_path, *args, env=None, config=None) -> subprocess.CompletedProcess:
    """The installed capbench, from a scratch folder, with relative paths: an MLA scales file and a local checkpoint
    folder holding only config.json."""
    write_scales(build_scales("mla", {0: (1500.0, 300.0), 1: (20.0, 4.0)}, 2, 8), tmp_path / "kimi.json")
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config or KIMI))
    env = env or {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    return subprocess.run([CAPBENCH, "sglang-launch", "--kv-scales", "kimi.json", "--dry-run", "--", "--model-path",
                           "ckpt", "--tp", "8", "--kv-cache-dtype", "fp8_e4m3", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,message", [
    (["--attention-backend", "aiter"], "use one of: fa3, flashmla, flashinfer, triton, trtllm_mla"),
    (["--attention-back", "aiter"], "--attention-backend aiter (mla)"),  # argparse's prefix, as SGLang reads it
    (["--attention-backend", "fa4"], "has not checked that backend"),
    (["--attention-backend", "triton", "--decode-attention-backend", "aiter"], "aiter"),
    ([], "name --attention-backend (no GPU found here"),
])
def test_a_backend_that_would_give_wrong_attention_is_refused(tmp_path, args, message):
    r = launch_in(tmp_path, *args)
    assert r.returncode == 2, r.stdout
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("tool,output,config,expected", [
    ("nvidia-smi", "9.0", KIMI, "fa3"),  # Hopper: SGLang's default is fa3, accepted with the upcast note
    ("nvidia-smi", "10.0", KIMI, "trtllm_mla"),  # Blackwell: the DeepSeek family's override
    ("rocminfo", "  Name: gfx942", KIMI, "triton"),  # 8 KV heads a rank at tp8: ROCm's MLA default is triton
])
def test_sglangs_default_on_this_gpu_is_checked(tmp_path, tool, output, config, expected):
    r = launch_in(tmp_path, env=fake_gpu(tmp_path, tool, output), config=config)
    assert r.returncode == 0, r.stderr
    assert "--attention-backend" not in r.stdout.split("exec:")[1]  # nothing added: SGLang picks it itself
    assert ("upcasts the whole FP8 MLA layer" in r.stdout) == (expected == "fa3")


def test_sglangs_aiter_default_is_refused_on_rocm(tmp_path):
    """DeepSeek-V3's 128 KV heads are 16 a rank at tp8: SGLang picks aiter, whose FP8 MLA write is unscaled."""
    r = launch_in(tmp_path, env=fake_gpu(tmp_path, "rocminfo", "  Name: gfx942"), config=DEEPSEEK)
    assert r.returncode == 2 and "--attention-backend aiter (mla)" in r.stderr and "use one of: triton" in r.stderr
