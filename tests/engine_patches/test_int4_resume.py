"""`capbench quantize-int4 --resume` trusts no finished shard blindly: each is checked against the size and SHA-256
recorded when it was written (fsynced), and one that differs is converted again, with a line saying so; the
finished OUT is read back (every shard's header against its size and the index) before exit 0."""

import json

import pytest
from safetensors import safe_open

from engine_patches.int4_moe import convert as conv
from tests.engine_patches.int4_checkpoints import make_checkpoint
from tests.engine_patches.test_int4_convert import SHARDS, capbench, glm  # noqa: F401  (fixture)


@pytest.fixture
def interrupted(glm, tmp_path, monkeypatch):  # noqa: F811
    """A conversion whose first shard finished and whose second did not (as after a crash)."""
    real = conv.convert_shard

    def dies_on_second_shard(src, partial, shard, *args):
        if shard == SHARDS[1]:
            raise KeyboardInterrupt
        return real(src, partial, shard, *args)

    class InProcess:
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
        conv.convert(glm, tmp_path / "q", tp=8, workers=1, show_progress=False)
    monkeypatch.undo()
    partial = tmp_path / "q.partial"
    record = json.loads((partial / conv.STATE / f"{SHARDS[0]}.json").read_text())
    assert record["file_bytes"] == (partial / SHARDS[0]).stat().st_size and len(record["sha256"]) == 64
    return partial


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A fresh, uninterrupted conversion of the same checkpoint (make_checkpoint is seeded), made once a module."""
    root = tmp_path_factory.mktemp("fresh")
    make_checkpoint(root / "glm", "glm")
    done = capbench("--in", str(root / "glm"), "--out", str(root / "int4"))
    assert done.returncode == 0, done.stderr
    return root


def loads_like_a_fresh_conversion(glm, fresh, out):  # noqa: F811
    for shard in SHARDS:
        assert (glm / shard).read_bytes() == (fresh / "glm" / shard).read_bytes()  # the same input
        assert (out / shard).read_bytes() == (fresh / "int4" / shard).read_bytes()
        with safe_open(out / shard, "pt") as f:
            assert len(list(f.keys())) > 0


def test_a_truncated_finished_shard_is_converted_again_on_resume(glm, tmp_path, interrupted, fresh):  # noqa: F811
    shard = interrupted / SHARDS[0]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])  # a crash before the data reached the disk
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--resume")
    assert r.returncode == 0, r.stderr
    assert (f"resume: {SHARDS[0]} cannot be trusted ({size // 2} bytes on disk, {size} written); "
            "converting it again") in r.stdout
    assert "2 shards (0 resumed)" in r.stdout
    out = tmp_path / "q"
    assert json.loads((out / "int4_report.json").read_text())["resumed_shards"] == 0
    loads_like_a_fresh_conversion(glm, fresh, out)


def test_a_finished_shard_with_flipped_bytes_is_converted_again_on_resume(glm, tmp_path, interrupted, fresh):  # noqa: F811
    shard = interrupted / SHARDS[0]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x10  # same size, different tensor bytes
    shard.write_bytes(bytes(data))
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--resume")
    assert r.returncode == 0, r.stderr
    assert f"resume: {SHARDS[0]} cannot be trusted (its SHA-256 differs" in r.stdout
    loads_like_a_fresh_conversion(glm, fresh, tmp_path / "q")


def test_an_intact_finished_shard_is_kept_on_resume(glm, tmp_path, interrupted):  # noqa: F811
    before = (interrupted / SHARDS[0]).stat().st_mtime_ns
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--resume")
    assert r.returncode == 0, r.stderr
    assert "cannot be trusted" not in r.stdout and "2 shards (1 resumed)" in r.stdout
    assert (tmp_path / "q" / SHARDS[0]).stat().st_mtime_ns == before  # not rewritten


def test_an_output_shard_that_changes_before_the_rename_leaves_no_out(glm, tmp_path, monkeypatch, fresh):  # noqa: F811
    """The final read-back: a shard damaged after its conversion (here, between the last worker and the rename) is
    found by its header before OUT exists; the CLI says which, and --resume repairs it."""
    real = conv._verify_output

    def damage_then_verify(p, records):
        shard = p.partial / SHARDS[1]
        shard.write_bytes(shard.read_bytes()[:-100])
        return real(p, records)

    monkeypatch.setattr(conv, "_verify_output", damage_then_verify)
    with pytest.raises(ValueError, match=f"{SHARDS[1]}: truncated"):
        conv.convert(glm, tmp_path / "q", tp=8, workers=1, show_progress=False)
    assert not (tmp_path / "q").exists()
    monkeypatch.undo()
    r = capbench("--in", str(glm), "--out", str(tmp_path / "q"), "--resume")
    assert r.returncode == 0, r.stderr
    assert f"resume: {SHARDS[1]} cannot be trusted" in r.stdout
    loads_like_a_fresh_conversion(glm, fresh, tmp_path / "q")
