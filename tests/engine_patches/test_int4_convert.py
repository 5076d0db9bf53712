"""`capbench quantize-int4` on bad and interrupted input, as a user runs it (the installed script): checks before
work, one line and exit 2 on bad input, nothing already stored lost, OUT complete or absent, --resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from engine_patches.int4_moe import convert as conv
from tests.engine_patches.int4_checkpoints import make_checkpoint

CAPBENCH = Path(sys.executable).parent / "capbench"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def capbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CAPBENCH), "quantize-int4", *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "200"})


def one_line_error(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture
def glm(tmp_path) -> Path:
    make_checkpoint(tmp_path / "glm", "glm")
    return tmp_path / "glm"


def test_truncated_shard_is_refused_before_any_work(glm, tmp_path):
    shard = glm / SHARDS[1]
    shard.write_bytes(shard.read_bytes()[:-1000])
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"))
    one_line_error(r, f"{SHARDS[1]}: truncated")
    assert not (tmp_path / "q").exists() and not (tmp_path / "q.partial").exists()


@pytest.mark.parametrize("damage,message", [
    (lambda root: (root / SHARDS[0]).write_bytes(b"\x10\x00"), "truncated"),
    (lambda root: (root / SHARDS[0]).write_bytes((2**40).to_bytes(8, "little") + b"{}"), "not safetensors"),
    (lambda root: (root / SHARDS[1]).unlink(), "names shards that are not in"),
    (lambda root: (root / "model.safetensors.index.json").write_text("[]"), "not a safetensors index"),
])
def test_damaged_checkpoints_are_refused(glm, tmp_path, damage, message):
    damage(glm)
    one_line_error(capbench("--in", str(glm), "--out", str(tmp_path / "q")), message)


def test_index_that_misplaces_a_tensor_is_refused(glm, tmp_path):
    index = json.loads((glm / "model.safetensors.index.json").read_text())
    name = next(n for n, s in index["weight_map"].items() if s == SHARDS[0])
    index["weight_map"][name] = SHARDS[1]
    (glm / "model.safetensors.index.json").write_text(json.dumps(index))
    one_line_error(capbench("--in", str(glm), "--out", str(tmp_path / "q")), f"puts {name} in {SHARDS[1]}")


def test_out_inside_in_and_existing_out_are_refused(glm, tmp_path):
    one_line_error(capbench("--in", str(glm), "--out", str(glm / "int4")), "must lie outside --in")
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "keep.txt").write_text("mine")
    one_line_error(capbench("--in", str(glm), "--out", str(tmp_path / "q")), "exists and is not empty")
    assert (tmp_path / "q" / "keep.txt").read_text() == "mine"


def test_group_size_that_ranks_cannot_hold_is_refused_with_what_works(glm, tmp_path):
    """The tiny model has 256 expert rows: 32 per rank at tp 8, so g128 cannot be loaded there."""
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--group-size", "128", "--tp", "8")
    one_line_error(r, "INT4 group size 128 does not divide the per-rank expert intermediate size 32 "
                      "(moe_intermediate_size 256 / 8 MoE ranks at tp 8); group sizes that work at tp 8: 32; "
                      "g128 needs --ep 4 or more")
    assert capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--group-size", "128", "--tp", "8",
                    "--ep", "4").returncode == 0


def test_glm46_at_tp8_accepts_g32_and_refuses_g128():
    """GLM-4.6's own numbers (moe_intermediate_size 1536, hidden 5120): 192 rows per rank at tp 8."""
    from engine_patches.int4_moe.layout import check_group_size, working_group_sizes

    assert working_group_sizes(1536, 5120, tp=8, ep=1) == [32]
    check_group_size(32, 1536, 5120, tp=8)
    with pytest.raises(ValueError, match="per-rank expert intermediate size 192"):
        check_group_size(128, 1536, 5120, tp=8)
    check_group_size(128, 1536, 5120, tp=8, ep=8)  # EP keeps whole experts on a rank
    assert working_group_sizes(2048, 7168, tp=8, ep=1) == [32, 128]  # Kimi K2: 256 rows per rank


def test_interrupted_conversion_resumes_after_the_finished_shards(glm, tmp_path, monkeypatch):
    out = tmp_path / "q"
    calls = []
    real = conv.convert_shard

    def dies_on_second_shard(src, partial, shard, *args):
        calls.append(shard)
        if shard == SHARDS[1]:
            raise KeyboardInterrupt  # the machine going away mid-run
        return real(src, partial, shard, *args)

    class InProcess:  # run the shards in this process so the interruption is deterministic
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            from concurrent.futures import Future

            f = Future()
            f.set_result(fn(*args))
            return f

    monkeypatch.setattr(conv, "convert_shard", dies_on_second_shard)
    monkeypatch.setattr(conv, "ProcessPoolExecutor", InProcess)
    with pytest.raises(KeyboardInterrupt):
        conv.convert(glm, out, tp=8, workers=1, show_progress=False)
    assert calls == SHARDS and not out.exists()  # no complete-looking output
    partial = tmp_path / "q.partial"
    assert (partial / SHARDS[0]).is_file() and not (partial / SHARDS[1]).exists()
    monkeypatch.undo()

    again = capbench("--in", str(glm), "--out", str(out))
    one_line_error(again, "holds an interrupted conversion: add --resume")
    resumed = capbench("--in", str(glm), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "2 shards (1 resumed)" in resumed.stdout
    assert not partial.exists() and sorted(p.name for p in out.glob("*.safetensors")) == SHARDS
    report = json.loads((out / "int4_report.json").read_text())
    assert report["resumed_shards"] == 1 and report["expert_tensors"] == 2 * 8 * 3
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for shard in SHARDS:
        with safe_open(out / shard, "pt") as f:
            assert {n for n, s in index["weight_map"].items() if s == shard} == set(f.keys())
    one_line_error(capbench("--in", str(glm), "--out", str(tmp_path / "other"), "--resume"), "nothing to resume")


def test_resume_refuses_a_partial_from_another_group_size(glm, tmp_path, monkeypatch):
    partial = tmp_path / "q.partial"
    (partial / conv.STATE).mkdir(parents=True)
    (partial / conv.STATE / "plan.json").write_text(json.dumps({"src": str(glm), "group_size": 128, "shards": {}}))
    one_line_error(capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--resume"), "another input or group size")


def test_parallel_workers_write_the_same_shards_as_one(glm, tmp_path):
    one = capbench("--in", str(glm), "--out", str(tmp_path / "one"), "--workers", "1")
    two = capbench("--in", str(glm), "--out", str(tmp_path / "two"), "--workers", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "1 workers" in one.stdout and "2 workers" in two.stdout
    for shard in SHARDS:
        assert (tmp_path / "one" / shard).read_bytes() == (tmp_path / "two" / shard).read_bytes()
