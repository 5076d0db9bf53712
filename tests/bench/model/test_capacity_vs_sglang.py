"""bench.capacity against SGLang 0.5.23's own functions, run on the same inputs.

What runs for real (installed wheel, sglang/srt/...): `ServerArgs.resolve_once` (the whole resolution pipeline,
so `arg_groups/memory_hook.py:handle_gpu_memory_settings`, `reserve_for_graph_mb`, the CUDA-graph defaults and the
attention-backend defaults all run), `runtime_context.create_context`/`use_context` (the published parallel state:
attn_tp, dcp), `ModelConfig` built from a config.json written here from the catalog, `KVCacheConfigurator`,
`DefaultPoolConfigurator` (`_compute_cell_size`, `calculate_pool_sizes`), `KVCacheConfigurator.resolve_max_num_reqs`
and `_resolve_memory_pool_config`.

What stands in for the GPU: `get_device_memory_capacity` returns the catalog's `memory_mib_reported`;
`runtime_context.override_platform(...)` (SGLang's own switch) states the GPU generation; `sglang.srt.utils.is_cuda`
is patched for the CUDA GPUs because `default_prefill_backend` asks that raw torch probe, which override_platform
does not reach; `get_available_gpu_memory` returns free memory = memory before load - weights.
"""

from __future__ import annotations

import json
import types

import pytest
import sglang.srt.utils
import torch
from sglang.srt import runtime_context
from sglang.srt.arg_groups import memory_hook
from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.mem_cache import kv_cache_configurator
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype
from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
    resolve_spec_aux_hidden_state_config,
)
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator, create_memory_pool_configurator
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from bench.model import capacity, catalog

GIB = 1 << 30
MODELS = ("kimi-k2-instruct", "glm-4.6")

# What each catalog GPU is, in SGLang's platform facts (runtime_context._PLATFORM_PROBES).
PLATFORMS = {
    "h100-sxm": dict(is_cuda=True, is_sm90=True, is_hopper_with_cuda_12_3=True, device_sm=90,
                     device_capability=(9, 0), has_flashinfer=True),
    "h200": dict(is_cuda=True, is_sm90=True, is_hopper_with_cuda_12_3=True, device_sm=90,
                 device_capability=(9, 0), has_flashinfer=True),
    "b200": dict(is_cuda=True, is_sm100=True, is_sm100_or_sm110=True, is_blackwell=True, device_sm=100,
                 device_capability=(10, 0), has_flashinfer=True),
    "a100-80gb": dict(is_cuda=True, device_sm=80, device_capability=(8, 0), has_flashinfer=True),
    "mi300x": dict(is_cuda=False, is_hip=True, device_sm=94, device_capability=(9, 4), has_flashinfer=False),
}


def hf_config(model: catalog.Model) -> dict:
    """The checkpoint's config.json, rebuilt from the catalog (transformers' DeepseekV3Config / Glm4MoeConfig keys).
    Text model only: Kimi K2.5's vision tower is not in the catalog, and no quantization_config (weights do not
    enter these functions)."""
    common = {
        "architectures": [model.architecture], "hidden_size": model.hidden_size,
        "num_hidden_layers": model.layers, "num_nextn_predict_layers": model.mtp_layers,
        "num_attention_heads": model.attention_heads, "num_key_value_heads": model.kv_heads,
        "n_routed_experts": model.routed_experts, "num_experts_per_tok": model.experts_per_token,
        "n_shared_experts": model.shared_experts, "moe_intermediate_size": model.moe_intermediate_size,
        "intermediate_size": model.dense_intermediate_size, "first_k_dense_replace": model.first_dense_layers,
        "vocab_size": model.vocab_size, "max_position_embeddings": model.max_context, "torch_dtype": "bfloat16",
    }
    if model.architecture == "DeepseekV3ForCausalLM":
        return {**common, "model_type": "deepseek_v3", "kv_lora_rank": model.kv_lora_rank,
                "q_lora_rank": model.q_lora_rank, "qk_rope_head_dim": model.qk_rope_head_dim,
                "qk_nope_head_dim": model.qk_nope_head_dim, "v_head_dim": model.v_head_dim}
    if model.architecture == "Glm4MoeForCausalLM":
        assert model.v_head_dim == model.head_dim  # Glm4MoeConfig has one head_dim for K and V
        return {**common, "model_type": "glm4_moe", "head_dim": model.head_dim, "partial_rotary_factor": 0.5}
    raise AssertionError(f"no config.json mapping for {model.architecture}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """A directory with config.json per model, and SGLang's lazy imports done on the plain CPU host (they probe
    the machine at import time, so they must not see the patched is_cuda)."""
    dirs = {}
    for model_id in catalog.models():
        path = tmp_path_factory.mktemp(model_id)
        (path / "config.json").write_text(json.dumps(hf_config(catalog.model(model_id))))
        dirs[model_id] = str(path)
    ServerArgs(model_path=dirs[MODELS[0]], device="cuda").resolve_once()
    return dirs


@pytest.fixture
def resolve(checkpoints, monkeypatch):
    """ServerArgs resolved by SGLang as on `gpu`: returns (server_args, resolving view)."""

    def run(model_id: str, gpu_id: str, tp: int, dp: int = 1, **args) -> tuple[ServerArgs, object]:
        gpu = catalog.gpu(gpu_id)
        facts = PLATFORMS[gpu_id]
        monkeypatch.setattr(memory_hook, "get_device_memory_capacity", lambda device=None: gpu.memory_mib_reported)
        monkeypatch.setattr(sglang.srt.utils, "is_cuda", lambda: facts["is_cuda"])
        server_args = ServerArgs(model_path=checkpoints[model_id], device="cuda", tp_size=tp, attn_dp_size=dp,
                                 **args)
        with runtime_context.override_platform(**facts):
            server_args.resolve_once()
        return server_args, resolving_view(server_args)

    return run


def configurator(server_args: ServerArgs) -> KVCacheConfigurator:
    """The KV-cache configurator ModelRunner.init_kv_cache_configurator builds, minus the loaded model (None: the
    cell size, pool size and request limit read only the config), inside a published context."""
    model_config = model_config_of(server_args)
    spec = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    kv_str, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=runtime_context.get_model().kv_cache_dtype, model=None,
        model_dtype=torch.bfloat16, is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
    return KVCacheConfigurator(
        device="cuda", gpu_id=0, attn_dp_size=runtime_context.get_parallel().attn_dp_size, pp_size=1,
        pp_group=None, model=None, model_config=model_config, server_args=server_args,
        kv_cache_dtype=kv_dtype, kv_cache_dtype_str=kv_str or runtime_context.get_model().kv_cache_dtype,
        model_dtype=torch.bfloat16, page_size=runtime_context.get_schedule().page_size, sliding_window_size=None,
        spec_algorithm=spec, is_draft_worker=False, post_capture_kv_active=False,
        spec_aux_config=resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=model_config, spec_algorithm=spec, is_draft_worker=False),
        is_hybrid_swa=model_config.is_hybrid_swa, is_hybrid_swa_compress=False,
        use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
        layer_info=resolve_layer_indices(model=None, model_config=model_config, is_draft_worker=False),
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None)


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("tp,dp", [(1, 1), (8, 1), (16, 1), (8, 8), (16, 4)])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_cell_size(resolve, model_id, tp, dp, kv_dtype):
    server_args, _ = resolve(model_id, "h200", tp, dp, kv_cache_dtype=kv_dtype)
    with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
        parallel = runtime_context.get_parallel()
        assert (parallel.attn_tp_size, parallel.attn_dcp_size) == (tp // dp, 1)
        kvc = configurator(server_args)
        pool = create_memory_pool_configurator(kvc)
        assert type(pool) is DefaultPoolConfigurator
        layers = kvc.layer_info.num_effective_layers
        sglang_cell = pool._compute_cell_size(kvc, layers)
    model = catalog.model(model_id)
    assert layers == model.layers
    assert pool._cell_size == sglang_cell
    assert capacity.cell_bytes(model, kv_dtype, tp // dp) == sglang_cell


@pytest.mark.parametrize("model_id", ["glm-4.6", "glm-4.5-air"])
@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_cell_size_with_mtp_draft(resolve, model_id, tp, kv_dtype):
    """--speculative-algorithm NEXTN (GLM's MTP layer as the draft, resolved by SGLang to EAGLE): the draft's KV
    is added to the cell in DefaultPoolConfigurator.__init__."""
    server_args, _ = resolve(model_id, "h200", tp, kv_cache_dtype=kv_dtype, speculative_algorithm="NEXTN")
    with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
        kvc = configurator(server_args)
        assert kvc.spec_algorithm.is_eagle()
        draft_layers = kvc.spec_aux_config.eagle_draft_num_layers
        sglang_cell = create_memory_pool_configurator(kvc)._cell_size
    model = catalog.model(model_id)
    assert draft_layers == model.mtp_layers
    assert capacity.cell_bytes(model, kv_dtype, tp, mtp=True) == sglang_cell > capacity.cell_bytes(model, kv_dtype, tp)


@pytest.mark.parametrize("model_id", sorted(catalog.models()))
def test_cell_size_every_catalog_model(resolve, model_id):
    server_args, _ = resolve(model_id, "h200", 8, kv_cache_dtype="fp8_e4m3")
    with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
        kvc = configurator(server_args)
        sglang_cell = create_memory_pool_configurator(kvc)._cell_size
    assert capacity.cell_bytes(catalog.model(model_id), "fp8_e4m3", 8) == sglang_cell


@pytest.mark.parametrize("gpu_id", sorted(PLATFORMS))
@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("tp,dp", [(1, 1), (4, 1), (8, 1), (16, 1), (8, 8)])
@pytest.mark.parametrize("context", [None, 8192])
def test_mem_fraction_static(resolve, gpu_id, model_id, tp, dp, context):
    _, view = resolve(model_id, gpu_id, tp, dp, context_length=context)
    ours = capacity.mem_fraction_static(catalog.model(model_id), catalog.gpu(gpu_id), tp, dp,
                                        context_len=context or catalog.model(model_id).max_context)
    assert ours == view.mem_fraction_static, (ours, view.mem_fraction_static, view.attention_backend)


def test_every_catalog_gpu_has_platform_facts():
    assert set(catalog.gpus()) <= set(PLATFORMS)


@pytest.mark.parametrize("gpu_id,model_id", [("h200", "kimi-k2-instruct"), ("h200", "glm-4.6"),
                                              ("a100-80gb", "glm-4.6"), ("b200", "glm-4.6")])
def test_tier_and_prefill_graph_pieces(resolve, gpu_id, model_id):
    """The pieces mem_fraction_static is built from, as SGLang resolved them. (Kimi on B200 is left out: SGLang
    turns its prefill graph off for trtllm_mla after the memory heuristic has counted it.)"""
    _, view = resolve(model_id, gpu_id, 8)
    graphs = view.cuda_graph_config
    chunked, decode_max_bs = capacity.memory_tier(catalog.gpu(gpu_id), 8)
    assert (view.chunked_prefill_size, graphs.decode.max_bs) == (chunked, decode_max_bs)
    assert graphs.prefill.backend == "breakable"
    if catalog.model(model_id).attention == "gqa":
        assert graphs.prefill.bs == capacity._prefill_graph_sizes(chunked)


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("context", [4096, 32768, 131072])
def test_max_running_requests(resolve, model_id, context):
    server_args, _ = resolve(model_id, "h200", 8, context_length=context)
    with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
        kvc = configurator(server_args)
        for tokens in (2, 1000, 4097, 8192, 100_000, 524_288, 1_000_000, 10_000_000):
            assert capacity.max_running_requests(tokens, context) == kvc.resolve_max_num_reqs(tokens), tokens


@pytest.mark.parametrize("gpu_id,model_id,tp,dp,kv_dtype,weights,page_size", [
    ("h200", "kimi-k2-instruct", 16, 1, "fp8_e4m3", "int4-g32", 64),
    ("h100-sxm", "glm-4.6", 8, 1, "fp8_e4m3", "fp8", 16),
    ("a100-80gb", "kimi-k2-thinking", 16, 1, "bf16", "native", 1),
    ("b200", "glm-4.6", 8, 1, "bf16", "native", 64),
    ("b200", "kimi-k2.5", 8, 1, "fp8_e4m3", "native", 64),
    ("h200", "glm-4.6", 8, 8, "bf16", "int4-g32", 1),
    ("mi300x", "glm-4.6", 8, 1, "bf16", "native", 1),
    ("mi300x", "kimi-k2-instruct", 4, 1, "fp8_e4m3", "int4-g32", 1),
])
def test_pool_tokens_and_requests_end_to_end(resolve, monkeypatch, gpu_id, model_id, tp, dp, kv_dtype, weights,
                                             page_size):
    """SGLang's _resolve_memory_pool_config (budget, pool size, request limit) fed with free memory = the memory
    bench.capacity assumes before load minus its weight estimate, against bench.capacity.capacity."""
    dep = capacity.Deployment(catalog.model(model_id), catalog.gpu(gpu_id), tp, dp, kv_dtype=kv_dtype,
                              weights=weights, page_size=page_size)
    ours = capacity.capacity(dep, with_ratios=False)
    server_args, view = resolve(model_id, gpu_id, tp, dp, kv_cache_dtype=kv_dtype, page_size=page_size)
    assert view.page_size == page_size
    pre_load_gb = (dep.gpu.memory_mib_reported * capacity.MIB - dep.gpu.reserved_before_load_gib * GIB) / GIB
    free_gb = pre_load_gb - ours.weight_bytes_per_gpu / GIB
    monkeypatch.setattr(kv_cache_configurator, "get_available_gpu_memory", lambda *a, **k: free_gb)
    with runtime_context.use_context(runtime_context.create_context(server_args, role="test")):
        # _profile_available_bytes only hands world_group.cpu_group on to get_available_gpu_memory (replaced
        # above); no process group exists here, so the group is a bare holder of that one attribute.
        with runtime_context.get_parallel().override(world_group=types.SimpleNamespace(cpu_group=None)):
            config = configurator(server_args)._resolve_memory_pool_config(pre_load_gb)
    assert ours.mem_fraction_static == config.mem_fraction_static == view.mem_fraction_static
    assert ours.kv_pool_tokens == config.max_total_num_tokens
    assert ours.max_running_requests == config.max_running_requests * dp


@pytest.mark.parametrize("gpu_id", sorted(PLATFORMS))
@pytest.mark.parametrize("model_id", MODELS)
def test_default_page_size(resolve, gpu_id, model_id):
    """SGLang's default --page-size is 1, except where the attention backend forces pages (trtllm_mla / trtllm_mha,
    SGLang's defaults on Blackwell, and flashmla take 64: overrides.py _mla_backend_page_constraints); bench's
    default follows the backend its launch line names (flashmla for an FP8 MLA cache on Hopper), else the GPU's
    default_page_size in data/gpus.yaml."""
    dep = capacity.Deployment(catalog.model(model_id), catalog.gpu(gpu_id), 8, kv_dtype="fp8_e4m3")
    _, view = resolve(model_id, gpu_id, 8, attention_backend=dep.attention)
    if view.attention_backend in ("trtllm_mla", "trtllm_mha", "flashmla"):
        assert view.page_size == 64
    assert view.page_size == dep.page_size
