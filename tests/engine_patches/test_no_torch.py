"""The commands that only build or check a command line run on a head node without torch: each is run as a user
runs it, by the `capbench` of a plain venv that holds capbench (editable, --no-deps) and the core dependencies
pyproject.toml lists, and nothing else (the venv is checked to hold no torch).

Building that venv takes minutes; it is built once per set of core dependencies and kept in the user's cache
(CAPBENCH_NOTORCH_VENV overrides the place), so later sessions reuse it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def core_dependencies() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def _venv_dir() -> Path:
    deps = core_dependencies()
    digest = hashlib.sha256(json.dumps([sys.version_info[:2], deps]).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "capbench"
    return Path(os.environ.get("CAPBENCH_NOTORCH_VENV", cache / f"venv-core-{digest}"))


@pytest.fixture(scope="session")
def capbench_without_torch() -> Path:
    """The `capbench` script of the torch-free venv, built on first use."""
    venv = _venv_dir()
    python = venv / "bin" / "python"
    ready = venv / "capbench-core.ready"
    if not ready.is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, *core_dependencies()], check=True)
        ready.write_text("\n".join(core_dependencies()))
    # editable, unless this checkout (and its pyproject.toml) is what it last installed: the venv may have been
    # built from another checkout
    installed = venv / "capbench-editable.json"
    mine = json.dumps([str(ROOT), hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()])
    if not installed.is_file() or installed.read_text() != mine:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e",
                        str(ROOT)], check=True, capture_output=True)
        installed.write_text(mine)
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr, "the venv must not hold torch"
    return venv / "bin" / "capbench"


def run(capbench: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(capbench), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def int4_checkpoint(tmp_path: Path) -> Path:
    """A local GLM-4.6-shaped INT4 W4A16 g32 checkpoint directory (config only: the launcher reads no weights)."""
    ckpt = tmp_path / "glm-int4"
    ckpt.mkdir()
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32, "strategy": "group"}
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["Glm4MoeForCausalLM"], "moe_intermediate_size": 1536, "hidden_size": 5120,
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "weights": weights, "targets": ["Linear"]}}}}))
    return ckpt


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_sglang_launch_dry_run_builds_the_command_without_torch(capbench_without_torch, tmp_path):
    ckpt = int4_checkpoint(tmp_path)
    p = run(capbench_without_torch, "sglang-launch", "--dry-run", "--kv-checksum", "verify", "--",
            "--model-path", str(ckpt), "--tp", "8", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    exec_line = next(line for line in p.stdout.splitlines() if line.startswith("exec: "))
    assert "-m sglang.launch_server --model-path" in exec_line
    assert "--disable-shared-experts-fusion" in exec_line  # read off the INT4 checkpoint (layout.py)
    assert "--radix-cache-backend capbench_kv_checksum" in exec_line
    assert "INT4 W4A16 g32 experts (Glm4MoeForCausalLM)" in p.stdout
    assert 'CAPBENCH_PATCHES={"kv_checksum": "verify"' in p.stdout


def test_fp8_scales_launch_is_checked_and_built_without_torch(capbench_without_torch, tmp_path):
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"model_type": "glm4_moe", "kv_cache": {"dtype": "float8_e4m3fn",
                                                                          "scaling_factor": {"0": {"0": 0.5}}}}))
    p = run(capbench_without_torch, "sglang-launch", "--dry-run", "--kv-scales", str(scales), "--",
            "--model-path", "zai-org/GLM-4.6", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "fa3",
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"--quantization-param-path {scales}" in p.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--kv-checksum", "sometimes"], "--kv-checksum must be one of"),
    (["--", "--model-path", "{ckpt}", "--tp", "7"], "does not split over 7 MoE ranks"),
    (["--", "--model-path", "{ckpt}", "--tp", "eight"], "--tp takes a whole number"),
    (["--kv-checksum", "verify", "--", "--model-path", "m", "--disable-radix-cache"], "--disable-radix-cache"),
])
def test_bad_launch_lines_fail_in_one_line_without_torch(capbench_without_torch, tmp_path, args, says):
    ckpt = int4_checkpoint(tmp_path)
    args = [a.replace("{ckpt}", str(ckpt)) for a in args]
    line = one_error_line(run(capbench_without_torch, "sglang-launch", "--dry-run", *args, cwd=tmp_path))
    assert says in line


def test_quantize_int4_checks_its_input_without_torch(capbench_without_torch, tmp_path):
    ckpt = int4_checkpoint(tmp_path)
    line = one_error_line(run(capbench_without_torch, "quantize-int4", "--in", str(ckpt), "--out",
                              str(tmp_path / "out"), "--group-size", "64", cwd=tmp_path))
    assert "--group-size must be 32 or 128" in line


def test_gpu_check_says_what_it_needs_without_torch(capbench_without_torch, tmp_path):
    line = one_error_line(run(capbench_without_torch, "gpu-check", "--out", str(tmp_path / "g.json"),
                              cwd=tmp_path))
    assert "torch" in line and "engine" in line
    assert not (tmp_path / "g.json").exists()
