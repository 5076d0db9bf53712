"""Priced = deployed: the launch command of every finalist of three plans (Kimi, GLM, DeepSeek) is accepted by SGLang
0.5.23's own parser with the flags the price rests on, and read back through capbench it is the priced
configuration again (tp, DP attention, EP, KV dtype, expert weights, memory fraction, page size, context), whose
KV pool is the one the plan sized."""

import argparse
import contextlib
import io
import shlex

import pytest
from sglang.srt.server_args import ServerArgs

from bench.errors import BadInput
from bench.model import Question, capacity, catalog, make_plan
from bench.model import launch as sglang_cmd

QUESTIONS = {
    "kimi": Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat",
                     target_rate_rps=25.0, price_per_gpu_hour=2.0, search_gpus=("h200",)),
    "glm": Question(model="glm-4.6", gpu="h200", tp=8, kv_dtype="bf16", workload="chat", target_rate_rps=10.0,
                    search_gpus=("h200",)),
    "deepseek": Question(model="deepseek-r1", gpu="h200", tp=8, kv_dtype="bf16", workload="chat",
                         target_rate_rps=10.0, search_gpus=("h200",)),
}


def sglang_parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"SGLang rejects {' '.join(args)}: {err.getvalue().strip().splitlines()[-1]}")


@pytest.fixture(scope="module", params=sorted(QUESTIONS))
def plan(request):
    return make_plan(QUESTIONS[request.param], workers=2)


def test_every_finalist_launches_as_priced(plan):
    finalists = plan.simulated
    assert len(finalists) >= 3
    assert any(o.config.dp > 1 for o in finalists) or any(o.config.ep > 1 for o in finalists)
    for o in finalists:
        lines = o.launch()
        assert lines == o.to_row()["launch"]
        for line in lines:
            argv = shlex.split(line)
            ns = sglang_parse(argv[argv.index("--") + 1:])
            cfg, cap = o.config, o.capacity
            assert (ns.tp_size, ns.attn_dp_size, ns.ep_size) == (cfg.tp, cfg.dp, cfg.ep), line
            assert ns.dp_size == 1 and ns.moe_a2a_backend == sglang_cmd.A2A_BACKEND
            assert ns.kv_cache_dtype == sglang_cmd.KV_FLAGS[cfg.kv_dtype]
            assert ns.mem_fraction_static == pytest.approx(cap.mem_fraction_static, abs=5e-4)
            assert ns.page_size == cap.page_size and ns.context_length == cap.context
            back = sglang_cmd.read_back(line)
            assert (back.model, back.tp, back.dp, back.ep, back.kv_dtype, back.weights) == (
                o.model, cfg.tp, cfg.dp, cfg.ep, cfg.kv_dtype, cfg.weights), line
            dep = capacity.Deployment(catalog.model(back.model), catalog.gpu(cfg.gpu), back.tp, back.dp, back.kv_dtype,
                                      back.weights, back.context, back.mem_fraction, back.page_size, ep=back.ep)
            again = capacity.capacity(dep, with_ratios=False)
            assert abs(again.kv_pool_tokens_total / cap.kv_pool_tokens_total - 1) < 1e-3, line


def test_the_multi_node_alternative_keeps_dp_attention_and_ep_over_all_gpus():
    _, multi = sglang_cmd.commands("kimi-k2-thinking", "h200", 8, "fp8_e4m3", "native", dp=8, ep=8,
                                   mem_fraction=0.88, page_size=1)
    assert len(multi) == 2
    for line in multi:
        back = sglang_cmd.read_back(line)
        assert (back.tp, back.dp, back.ep, back.nodes) == (16, 16, 16, 2)


def test_an_int4_checkpoint_is_priced_and_launched_with_the_ep_its_groups_need():
    q = Question(model="glm-4.5-air", gpu="h100-sxm", tp=8, weights="int4-g32")
    ep = sglang_cmd.int4_ep("glm-4.5-air", 8, "int4-g32")
    assert ep > 1 and q.chosen.ep == ep  # 1408 / 8 rows per rank is not a whole number of 32-row groups
    line = sglang_cmd.single_node("glm-4.5-air", 8, "bf16", "int4-g32", ep=q.chosen.ep)
    assert sglang_cmd.read_back(line).ep == ep and sglang_cmd.read_back(line).weights == "int4-g32"


def test_the_deprecated_dp_attention_spelling_reads_back_the_same():
    a = sglang_cmd.read_back("python -m sglang.launch_server --model-path zai-org/GLM-4.6 --tp 8 --dp 8 "
                             "--enable-dp-attention --kv-cache-dtype fp8_e4m3")
    b = sglang_cmd.read_back("python -m sglang.launch_server --model-path zai-org/GLM-4.6 --tp 8 --attn-dp-size 8 "
                             "--kv-cache-dtype fp8_e4m3")
    assert a == b and a.dp == 8 and a.kv_dtype == "fp8_e4m3"


def test_a_command_without_a_catalog_model_is_refused():
    with pytest.raises(BadInput, match="no catalog model"):
        sglang_cmd.read_back("python -m sglang.launch_server --model-path someone/else --tp 8")
    with pytest.raises(BadInput, match="no --model-path"):
        sglang_cmd.read_back("capbench sglang-launch -- --tp 8")
