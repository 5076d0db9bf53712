"""`capbench calibrate-kv-scales` and `capbench quantize-int4` as a user runs them: the venv's installed
`capbench` script in a subprocess, in the `make test` environment as it is (PyPI's CUDA torchvision beside a CPU
torch, no op schemas defined in the child).

calibrate-kv-scales talks HTTP to a server; SGLang cannot start here (no CUDA), so the server is a stand-in on
127.0.0.1 (in this test process) whose completion handler writes each prompt's K/V through SGLang's real
MHATokenToKVPool, patched by `engine_patches.fp8_scales.patch.apply` exactly as in a scheduler process; the
command reads the maxima the patched pool dumps, as it reads a real server's."""

import json
import os
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_loader.weight_utils import kv_cache_scales_loader

from engine_patches.fp8_scales import patch
from tests.engine_patches.int4_checkpoints import make_checkpoint

LAYERS, HEADS, HEAD_DIM = 4, 2, 64
CAPBENCH = Path(sys.executable).parent / "capbench"  # the installed console script


def capbench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(CAPBENCH), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def test_the_installed_cli_has_a_torchvision_that_cannot_load():
    """The environment these subprocess tests stand in: importing transformers' model code fails in a fresh
    interpreter (so the commands below work because they never import it, not because anything was patched)."""
    out = subprocess.run([sys.executable, "-c", "from transformers import PreTrainedModel"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "torchvision" in out.stderr


@pytest.fixture
def stand_in_server(monkeypatch, tmp_path):
    monkeypatch.setattr(MHATokenToKVPool, "set_kv_buffer", MHATokenToKVPool.set_kv_buffer)
    monkeypatch.setattr(patch, "_applied", set())
    monkeypatch.setenv(patch.ENV_INTERVAL, "0")
    amax_path = tmp_path / "amax"
    patch.apply(type("Args", (), {"record_kv_amax": str(amax_path), "kv_scales": None}))
    pool = MHATokenToKVPool(4096, 16, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    layers = [RadixAttention(HEADS, HEAD_DIM, 0.125, HEADS, layer_id=i) for i in range(LAYERS)]
    written = {i: [0.0, 0.0] for i in range(LAYERS)}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply({"data": [{"id": "tiny-glm"}]})

        def do_POST(self):
            prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
            n = min(len(prompt) // 4 + 1, 256)
            gen = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
            with lock:
                for i in range(LAYERS):
                    k = torch.randn(n, HEADS, HEAD_DIM, generator=gen) * (3 + 20 * i)
                    v = torch.randn(n, HEADS, HEAD_DIM, generator=gen) * (2 + 5 * i)
                    if "vault" in prompt and i == 3:
                        k[0, 0, 0] = 2500.0  # the long-context prompts carry an outlier past 448
                    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
                    pool.set_kv_buffer(layers[i], torch.arange(16, 16 + n), k, v)
                    written[i] = [max(written[i][0], float(k.abs().max())), max(written[i][1], float(v.abs().max()))]
            self.reply({"choices": [{"text": "ok"}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", amax_path, written
    server.shutdown()


def test_calibrate_kv_scales_end_to_end(stand_in_server, tmp_path):
    url, amax_path, written = stand_in_server
    out = tmp_path / "glm-kv-scales.json"
    result = capbench("calibrate-kv-scales", "--target", url, "--amax", str(amax_path), "--out", str(out),
                      "--tp-size", "2", "--model-type", "glm4_moe")
    assert result.returncode == 0, result.stderr
    assert "4 MHA layers x 2 TP ranks" in result.stdout and "1 layers exceed 448" in result.stdout
    for rank in (0, 1):  # SGLang's own loader
        joint = dict(kv_cache_scales_loader(str(out), rank, 2, LAYERS, "glm4_moe"))
        assert joint == pytest.approx({i: max(written[i]) / 448 for i in range(LAYERS)}, rel=1e-6)
    doc = json.loads(out.read_text())
    assert doc["capbench"]["k_scale"]["0"]["3"] == pytest.approx(written[3][0] / 448) and written[3][0] > 2400


def test_calibrate_kv_scales_bad_input_is_one_line(tmp_path):
    out = capbench("calibrate-kv-scales", "--target", "http://127.0.0.1:9", "--amax", str(tmp_path / "a"),
                   "--out", str(tmp_path / "s.json"))
    assert out.returncode == 2 and out.stderr.startswith("error: cannot reach http://127.0.0.1:9")
    assert len(out.stderr.strip().splitlines()) == 1
    missing = capbench("calibrate-kv-scales", "--target", "http://127.0.0.1:9", "--amax", "a", "--out", "b",
                       "--prompts", str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: prompt file not found: {tmp_path}/missing.jsonl"


def test_quantize_int4_command(tmp_path):
    make_checkpoint(tmp_path / "glm", "glm")
    result = capbench("quantize-int4", "--in", str(tmp_path / "glm"), "--out", str(tmp_path / "q"),
                      "--group-size", "128", "--tp", "2")
    assert result.returncode == 0, result.stderr
    assert "overall relative error" in result.stdout and (tmp_path / "q" / "int4_report.json").is_file()
    assert json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["config_groups"][
        "group_0"]["weights"]["group_size"] == 128
    assert not (tmp_path / "q.partial").exists()


def test_quantize_int4_bad_input_is_one_line(tmp_path):
    out = capbench("quantize-int4", "--in", str(tmp_path), "--out", str(tmp_path / "o"), "--group-size", "64")
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: --group-size must be 32 or 128 (what SGLang's WNA16 MoE kernels take), got 64")
    nope = capbench("quantize-int4", "--in", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert nope.returncode == 2 and nope.stderr.strip() == f"error: {tmp_path}/nope is not a checkpoint directory " \
        "(no config.json)"
