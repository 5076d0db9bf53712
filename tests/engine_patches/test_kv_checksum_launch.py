"""The patch's contact surface with SGLang 0.5.23, its metrics on SGLang's /metrics, and the launcher."""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from engine_patches.kv_checksum import sglang_symbols
from engine_patches.launch import PatchOptions, build_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HICACHE_ARGS = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_io_backend": "direct",
                "hicache_mem_layout": "layer_first"}
TORCHVISION_OPS = """
import torch
_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
"""


def test_pinned_sglang_version():
    assert importlib.metadata.version("sglang") == sglang_symbols.SGLANG_VERSION


@pytest.mark.parametrize("symbol", sglang_symbols.SYMBOLS)
def test_every_touched_symbol_exists(symbol):
    module, path = symbol.split(":")
    obj = importlib.import_module(module)
    for part in path.split("."):
        if hasattr(obj, "__dataclass_fields__") and part in obj.__dataclass_fields__:
            obj = obj.__dataclass_fields__[part]
            continue
        assert hasattr(obj, part), f"{symbol}: {part} is gone"
        obj = getattr(obj, part)


def test_touched_fields_exist_on_real_objects():
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import TreePathNodeInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

    from tests.engine_patches.kv_server import Geometry, Server, make_pool

    assert set(sglang_symbols.MATCH_PREFIX_PARAMS_FIELDS) <= set(MatchPrefixParams.__dataclass_fields__)
    assert set(sglang_symbols.TREE_PATH_NODE_FIELDS) <= set(TreePathNodeInfo.__struct_fields__)
    server = Server(Geometry("mha"), hicache=True, server_args=HICACHE_ARGS)
    try:
        req = Req("r", "", array("q", [1, 2, 3]), SamplingParams())
        host = server.tree.cache_controller.mem_pool_host.anchor_entry.host_pool
        mla_server = Server(Geometry("mla"), hicache=True, server_args=HICACHE_ARGS)
        mla_host = mla_server.tree.cache_controller.mem_pool_host.anchor_entry.host_pool
        mla_server.close()
        objects = {"UnifiedRadixCache": server.tree, "Req": req, "ReqKvInfo": req.kv,
                   "RadixKey": RadixKey(array("q", [1])), "MHATokenToKVPool": server.pool,
                   "MLATokenToKVPool": make_pool(Geometry("mla")), "MHATokenToKVPoolHost": host,
                   "MLATokenToKVPoolHost": mla_host}
        for name, attrs in sglang_symbols.INSTANCE_ATTRS.items():
            assert type(objects[name]).__name__ == name or name == "UnifiedRadixCache"
            for attr in attrs:
                assert hasattr(objects[name], attr), f"{name}.{attr} is gone"
    finally:
        server.close()


@pytest.mark.parametrize("module,cls,assignment", sglang_symbols.ASSIGNED_IN_SOURCE)
def test_attributes_assigned_in_source_exist(module, cls, assignment):
    import inspect

    assert assignment in inspect.getsource(getattr(importlib.import_module(module), cls))


def test_counters_appear_on_sglangs_metrics_endpoint(tmp_path, monkeypatch):
    """A scheduler-like process increments the counters; SGLang's own /metrics app (multiprocess collector)
    serves them."""
    child = textwrap.dedent("""
        from engine_patches.kv_checksum.metrics import kv_checksum_metrics
        m = kv_checksum_metrics()
        m.pages_checksummed.inc(7); m.pages_verified.inc(5); m.seconds.inc(0.25)
        m.mismatches.labels(source="admission").inc()
        m.verifications.labels(source="insert").inc(3)
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)

    from fastapi import FastAPI
    from sglang.srt.utils.common import add_prometheus_middleware
    from starlette.testclient import TestClient

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    app = FastAPI()
    add_prometheus_middleware(app)
    text = TestClient(app).get("/metrics").text
    assert "capbench_kv_pages_checksummed_total 7.0" in text
    assert "capbench_kv_pages_verified_total 5.0" in text
    assert 'capbench_kv_checksum_mismatch_total{source="admission"} 1.0' in text
    assert "capbench_kv_checksum_seconds_total 0.25" in text
    assert 'capbench_kv_verifications_total{source="insert"} 3.0' in text


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_help_documents_the_flags():
    out = cli("sglang-launch", "--help").stdout
    for flag in ("--kv-checksum", "--kv-scrub-pages-per-s", "--integrity-log", "verify", "strict"):
        assert flag in out


def test_dry_run_prints_active_patches_and_the_sglang_command(tmp_path):
    log = tmp_path / "events.jsonl"
    r = cli("sglang-launch", "--kv-checksum", "strict", "--kv-scrub-pages-per-s", "50", "--integrity-log", str(log),
            "--dry-run", "--", "--model-path", "moonshotai/Kimi-K2-Thinking", "--tp", "8")
    assert r.returncode == 0, r.stderr
    assert "kv_checksum: strict, scrub 50 pages/s" in r.stdout
    assert "-m sglang.launch_server --model-path moonshotai/Kimi-K2-Thinking --tp 8 " \
           "--radix-cache-backend capbench_kv_checksum" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("CAPBENCH_PATCHES="))
    assert json.loads(line.split("=", 1)[1]) == {"kv_checksum": "strict", "kv_scrub_pages_per_s": 50.0,
                                                 "integrity_log": str(log), "kv_scales": None,
                                                 "record_kv_amax": None}


def test_off_adds_nothing():
    argv, _ = build_command(PatchOptions(), ["--model-path", "zai-org/GLM-4.6"])
    assert argv[-2:] == ["--model-path", "zai-org/GLM-4.6"]


HICACHE = ["--enable-hierarchical-cache"]


@pytest.mark.parametrize("args,message,env", [
    (["--kv-checksum", "paranoid"], "--kv-checksum must be one of", {}),
    (["--kv-checksum", "verify", "--", "--radix-cache-backend", "flexkv"], "drop yours", {}),
    (["--kv-checksum", "verify", "--", "--disable-radix-cache"], "drop --disable-radix-cache", {}),
    (["--kv-scrub-pages-per-s", "10"], "needs --kv-checksum", {}),
    (["--kv-checksum", "verify", "--integrity-log", "/nonexistent/dir/x.jsonl"], "does not exist", {}),
    (["--kv-checksum", "verify", "--", *HICACHE, "--hicache-storage-backend", "file"], "storage backends", {}),
    (["--kv-checksum", "verify", "--", "--speculative-algorithm", "EAGLE"], "draft tokens rewrite", {}),
    (["--kv-checksum", "strict", "--", "--enable-lmcache"], "not LMCache's", {}),
    (["--kv-checksum", "verify", "--", *HICACHE], "NHD pools only", {"SGLANG_USE_HND_KVCACHE": "1"}),
    (["--kv-checksum", "verify", "--", *HICACHE, "--kv-cache-dtype", "nvfp4"], "scale buffers", {}),
])
def test_bad_input_is_one_line_and_exit_2(args, message, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = cli("sglang-launch", *args, "--dry-run")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,env", [
    (HICACHE, {}),  # host-memory HiCache is covered
    (["--kv-cache-dtype", "nvfp4"], {}),  # FP4 scale buffers are part of the checksum
    (["--page-size", "16"], {"SGLANG_USE_HND_KVCACHE": "1"}),  # HND pools are covered (device side)
])
def test_covered_configurations_launch(args, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = cli("sglang-launch", "--kv-checksum", "verify", "--dry-run", "--", "--model-path", "zai-org/GLM-4.6", *args)
    assert r.returncode == 0, r.stderr


def test_patches_reach_processes_spawned_like_sglangs_schedulers(tmp_path):
    """The launcher's environment, a parent that spawns a child with multiprocessing 'spawn' (as SGLang starts its
    schedulers), and the child building its tree cache the way SGLang's scheduler does (create_tree_cache with the
    launch's --radix-cache-backend): it gets the checksummed unified tree, and the fill and admission hooks are on
    SGLang's classes once it imports them."""
    log = tmp_path / "events.jsonl"
    _, env = build_command(PatchOptions("verify", 3.0, str(log)), [])
    parent = tmp_path / "parent.py"
    parent.write_text(TORCHVISION_OPS.replace("import torch", "def child(q):\n    import torch").replace(
        "\n_lib", "\n    _lib") + textwrap.dedent("""
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
        from sglang.srt.runtime_context import get_context, get_parallel
        get_context().override_server_args(radix_cache_backend="capbench_kv_checksum").install()
        pool = MLATokenToKVPool(64, 16, torch.bfloat16, 32, 16, 2, "cpu", False)
        alloc = PagedTokenToKVPoolAllocator(64, 16, torch.bfloat16, "cpu", pool, need_sort=False)
        params = CacheInitParams(disable=False, req_to_token_pool=ReqToTokenPool(2, 64, "cpu", False),
                                 token_to_kv_pool_allocator=alloc, page_size=16)
        ctx = TreeCacheBuildContext(server_args=None, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
                                    enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=None,
                                    model_config=None, tp_size=1, tp_rank=0, tp_group=None)
        with get_parallel().override(tp_rank=0):
            cache = create_tree_cache(ctx)
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.model_executor.model_runner import ModelRunner
        hooked = [getattr(ModelRunner.forward, "_capbench_seals", False),
                  getattr(Req.init_next_round_input, "_capbench_admission", False)]
        q.put([type(cache).__name__, cache.kv_mode, cache.scrub_pages_per_s, str(cache.kv_log.path), *hooked])
    """).replace("\n", "\n    ") + textwrap.dedent("""

    if __name__ == "__main__":
        import multiprocessing as mp
        import sys
        assert "sglang" not in sys.modules
        mp.set_start_method("spawn", force=True)
        q = mp.Queue()
        p = mp.Process(target=child, args=(q,))
        p.start()
        print(q.get(timeout=240))
        p.join()
    """))
    r = subprocess.run([sys.executable, str(parent)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str(["ChecksummedUnifiedRadixCache", "verify", 3.0, str(log),
                                                     True, True])


def test_boot_runs_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    _, env = build_command(PatchOptions("verify"), [])
    env["PYTHONPATH"] += os.pathsep + str(other)
    code = "import os, sys; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'), 'sglang' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["1", "False"]  # the other one ran, and nothing heavy was imported


def test_sglangs_own_parser_accepts_the_launch_arguments():
    import argparse

    from sglang.srt.server_args import ServerArgs

    argv, _ = build_command(PatchOptions("verify"), ["--model-path", "moonshotai/Kimi-K2-Thinking", "--tp", "8",
                                                     "--page-size", "64"])
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv[argv.index("sglang.launch_server") + 1:])
    assert (ns.radix_cache_backend, ns.tp_size, ns.page_size) == ("capbench_kv_checksum", 8, 64)


def test_every_patch_on_one_trigger_module_is_applied(monkeypatch, capsys):
    import engine_patches.launch as launch

    sys.modules.pop("colorsys", None)
    two = [launch.Patch(name, lambda o: True, lambda o: [], "colorsys", "builtins:print") for name in ("p1", "p2")]
    monkeypatch.setattr(launch, "PATCHES", two)
    monkeypatch.setenv(launch.ENV, json.dumps({"kv_checksum": "verify"}))
    assert launch.install_hooks() == ["p1", "p2"]
    assert capsys.readouterr().out == ""  # nothing runs before the trigger module is imported
    importlib.import_module("colorsys")
    assert capsys.readouterr().out.count("PatchOptions(kv_checksum='verify'") == 2
