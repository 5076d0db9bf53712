"""A user's catalog override file of the wrong shape is one line naming the file and the offending key."""

import os
import subprocess
import sys

import pytest

from bench.errors import BadInput
from bench.model import catalog

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

BAD = [
    (b"- a\n- b\n", "expected a mapping (models: / gpus:), not a list"),
    (b"5\n", "not a int"),
    (bytes(range(256)) * 2, "not UTF-8 text"),
    (b"gpus: {}\x00\n", "binary file (NUL bytes)"),
    (b"gpus:\n  h200:\n    hbm_tbps: 0\n", "gpus.h200.hbm_tbps: Input should be greater than 0, got 0"),
    (b"gpus:\n  h200:\n    interconnect_gbps: -1\n", "gpus.h200.interconnect_gbps"),
    (b"gpus:\n  h200:\n    bf16_tflops: .nan\n", "gpus.h200.bf16_tflops: Input should be a finite number, got nan"),
    (b"gpus:\n  h200:\n    gpus_per_node: 1e400\n", "gpus.h200.gpus_per_node"),
    (b"gpus:\n  h200:\n    hbm_tbpss: 4\n", "gpus.h200.hbm_tbpss: unknown key"),
    (b"gpus:\n  h200: [1]\n", "gpus.h200: expected a map of fields, not a list"),
    (b"models: 3\n", "models: expected a map of id -> fields, not a int"),
    (b"models:\n  kimi-k2-thinking:\n    layers: many\n", "models.kimi-k2-thinking.layers"),
    (b"models:\n  kimi-k2-thinking:\n    kv_heads: 0\n", "models.kimi-k2-thinking.kv_heads"),
    (b"models:\n  kimi-k2-thinking:\n    published_params_b: {total: .inf}\n",
     "models.kimi-k2-thinking.published_params_b.total"),
    (b"models:\n  a: &a {x: 1}\n  b: *a\n", "aliases"),
    (b"models: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested deeper"),
    (b"extra: 1\n", "unknown section(s) extra"),
    (b"gpus: {h200: {hbm_tbps: [1, 2]}}\n", "hbm_tbps"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_a_bad_override_file_names_the_offending_key(tmp_path, monkeypatch, text, message):
    path = tmp_path / "catalog.yaml"
    path.write_bytes(text)
    monkeypatch.setenv("CAPBENCH_CATALOG", str(path))
    with pytest.raises(BadInput) as e:
        catalog.gpus()
    assert message in str(e.value) and str(path) in str(e.value)


def test_a_good_override_still_merges(tmp_path, monkeypatch):
    path = tmp_path / "catalog.yaml"
    path.write_text("gpus:\n  h200:\n    price_per_gpu_hour: 9.5\n")
    monkeypatch.setenv("CAPBENCH_CATALOG", str(path))
    assert catalog.gpu("h200").price_per_gpu_hour == 9.5


def test_on_the_command_line_it_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("gpus:\n  h200:\n    hbm_tbps: 0\n")
    proc = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "capacity", "--model",
                           "kimi-k2-thinking", "--gpu", "h200", "--tp", "8"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "CAPBENCH_CATALOG": str(path)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "hbm_tbps" in proc.stderr, proc.stderr
