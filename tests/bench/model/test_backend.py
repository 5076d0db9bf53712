"""data/attention_backends.yaml against SGLang 0.5.23's own choice: for every catalog model on every catalog GPU, the
default bench/model/fits/backend.py reads off the file is the backend SGLang's resolution picks, run on CPU with the
machine's facts declared through SGLang's own `override_platform` (the family override first, as model_hook runs it,
then get_default_attn_backend); and every launch line capbench prints names a backend that keeps the scales."""

from types import SimpleNamespace

import pytest
from sglang.srt.arg_groups.model_override_base import get_default_attn_backend
from sglang.srt.arg_groups.model_overrides.deepseek_v2 import _deepseek_family_overrides
from sglang.srt.runtime_context import override_platform

from bench.model import backend, catalog, launch

# What SGLang's platform probe answers on each architecture (runtime_context's facts).
PLATFORMS = {
    "sm80": dict(is_hopper_with_cuda_12_3=False, is_sm100=False, is_hip=False, has_flashinfer=True),
    "sm90": dict(is_hopper_with_cuda_12_3=True, is_sm100=False, is_hip=False, has_flashinfer=True),
    "sm100": dict(is_hopper_with_cuda_12_3=False, is_sm100=True, is_hip=False, has_flashinfer=True),
    "gfx942": dict(is_hopper_with_cuda_12_3=False, is_sm100=False, is_hip=True, has_flashinfer=False),
}
FAMILY = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration")


def sglang_choice(model, gpu, tp: int = 8) -> str:
    """The attention backend SGLang 0.5.23's resolution settles on when none is named."""
    args = SimpleNamespace(attention_backend=None, prefill_attention_backend=None, decode_attention_backend=None,
                           speculative_algorithm=None, speculative_eagle_topk=None, page_size=None, tp_size=tp,
                           dcp_size=1, enable_prefill_cp=False, enable_hisparse=False, enable_hierarchical_cache=False,
                           disaggregation_mode="null", kv_cache_dtype="auto", moe_runner_backend="auto",
                           fp8_gemm_runner_backend="auto", _resolved_overrides=[])
    hf_config = SimpleNamespace(architectures=[model.architecture], model_type=model.architecture,
                                quantization_config=None)
    with override_platform(**PLATFORMS[gpu.arch]):
        if model.architecture in FAMILY:
            declared = _deepseek_family_overrides(args, hf_config)
            args._resolved_overrides.append(("model", declared))
            if declared.get("attention_backend"):
                return declared["attention_backend"]
        model_config = SimpleNamespace(hf_config=hf_config, has_attention_sinks=False, has_asymmetric_kv=False,
                                       get_num_kv_heads=lambda t: max(1, model.kv_heads // t))
        return get_default_attn_backend(args, model.attention == "mla", model_config)


CASES = [(m, g) for m in catalog.models() for g in catalog.gpus()]


@pytest.mark.parametrize(("model_id", "gpu_id"), CASES)
def test_default_is_sglangs_own_choice(model_id, gpu_id):
    m, g = catalog.model(model_id), catalog.gpu(gpu_id)
    assert backend.default_backend(m, g) == sglang_choice(m, g)


def test_the_choice_depends_on_what_the_file_says():
    """The comparison can fail: Kimi on H200 is fa3 and on B200 trtllm_mla (the family override), GLM on B200 is
    trtllm_mha, and DeepSeek-V3 (16 KV heads a rank at tp8) takes aiter on MI300X where Kimi (8) takes triton."""
    kimi, glm, ds = (catalog.model(x) for x in ("kimi-k2-thinking", "glm-4.6", "deepseek-v3"))
    h200, b200, mi300x = (catalog.gpu(x) for x in ("h200", "b200", "mi300x"))
    assert [sglang_choice(kimi, h200), sglang_choice(kimi, b200), sglang_choice(glm, b200)] == \
        ["fa3", "trtllm_mla", "trtllm_mha"]
    assert (sglang_choice(ds, mi300x), sglang_choice(kimi, mi300x)) == ("aiter", "triton")


@pytest.mark.parametrize(("model_id", "gpu_id"), CASES)
def test_launch_lines_name_a_backend_that_keeps_the_scales(model_id, gpu_id):
    m, g = catalog.model(model_id), catalog.gpu(gpu_id)
    for kv in ("bf16", "fp8_e4m3"):
        single, multi = launch.commands(model_id, gpu_id, 8, kv, "native")
        for line in [single, *multi] if single else multi:
            named = launch.read_back(line).attention
            assert named in backend.candidates(m, g, kv), line
            if kv == "fp8_e4m3":
                assert backend.refusal(named, m.attention, g.arch) is None


def test_refused_backends_name_the_ones_that_work():
    line = backend.refusal("aiter", "mla", "gfx942")
    assert line and "use one of: triton" in line
    assert backend.refusal("flashmla", "mla", "sm90") is None


def test_fp8_mla_avoids_the_whole_buffer_upcast_where_a_native_reader_runs():
    kimi = catalog.model("kimi-k2-thinking")
    assert backend.launch_backend(kimi, catalog.gpu("h200"), "fp8_e4m3") == "flashmla"
    assert backend.launch_backend(kimi, catalog.gpu("h200"), "bf16") == "fa3"
