"""The disaggregated plan's launch commands (bench/model/disagg_launch.py), parsed by SGLang 0.5.23's own ServerArgs
parser, and the router line by sglang-router's own parser (`launch_router.parse_router_args`), for the shapes the
Planner prints: one-node and multi-node instances, DP or TP attention on prefill, EPLB on and off."""

import argparse
import contextlib
import io
import shlex

import pytest
from sglang.srt.server_args import ServerArgs
from sglang_router.launch_router import parse_router_args

from bench.model import disagg, disagg_launch
from bench.model.slo import Slo


def sglang_parse(argv: list[str]) -> argparse.Namespace:
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv[3:])
    except SystemExit:
        pytest.fail(f"SGLang rejects {shlex.join(argv)}: {err.getvalue().strip().splitlines()[-1]}")


SHAPES = [("kimi-k2-thinking", "h200", 8, 8, True, True), ("kimi-k2-thinking", "h200", 16, 32, False, True),
          ("deepseek-v3", "h100-sxm", 32, 72, True, True), ("glm-4.6", "h200", 8, 16, True, False)]


@pytest.mark.parametrize("model,gpu,p,d,dpa,eplb", SHAPES)
def test_every_instance_and_the_router_parse(model, gpu, p, d, dpa, eplb):
    shape = disagg.Shape(model, gpu, p, d, "fp8_e4m3", eplb=eplb, prefill_dp_attention=dpa)
    a = disagg.evaluate(shape, disagg.Lengths(2000, 0, 300, 2300), Slo(ttft_s=5, tpot_s=0.1), 30.0)
    assert a.serves, a.rejected_because
    launches = disagg_launch.commands(a)
    per_node = 8
    roles = [x.role for x in launches]
    assert roles.count("prefill") == a.prefill_instances * max(1, p // per_node)
    assert roles.count("decode") == a.decode_instances * max(1, d // per_node)
    assert roles[-1] == "router" and roles.count("router") == 1
    for x in launches[:-1]:
        ns = sglang_parse(shlex.split(x.command))
        g = p if x.role == "prefill" else d
        assert ns.disaggregation_mode == x.role and ns.disaggregation_transfer_backend == "mooncake"
        assert ns.tp_size == g and ns.ep_size == g and ns.moe_a2a_backend == "deepep"
        assert ns.deepep_mode == ("normal" if x.role == "prefill" else "low_latency")
        assert ns.kv_cache_dtype == "fp8_e4m3" and ns.enable_two_batch_overlap
        assert ns.mem_fraction_static == pytest.approx(disagg.pd_mem_fraction(model, gpu), abs=1e-3)
        dp_attention = x.role == "decode" or dpa
        assert ns.enable_dp_attention == dp_attention and ns.dp_size == (g if dp_attention else 1)
        assert ns.enable_eplb == eplb and ns.ep_num_redundant_experts == shape.redundant(x.role)
        assert ns.nnodes == max(1, g // per_node) and ns.node_rank == x.node
        if ns.nnodes > 1:
            assert ns.dist_init_addr == f"{x.role.upper()}{x.instance}_NODE0:5000"
        if x.role == "decode":
            assert ns.max_running_requests == a.batch_per_rank * d and ns.cuda_graph_max_bs_decode == a.batch_per_rank
        else:
            assert ns.chunked_prefill_size == disagg.chunk(shape) * ns.dp_size
    router = shlex.split(launches[-1].command)
    assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
    args = parse_router_args(router[3:])
    assert args.pd_disaggregation
    assert [u for u, _ in args.prefill_urls] == [f"http://PREFILL{i}_NODE0:30000" for i in range(a.prefill_instances)]
    assert all(port == 8998 for _, port in args.prefill_urls)
    assert args.decode_urls == [f"http://DECODE{j}_NODE0:30000" for j in range(a.decode_instances)]


def test_a_typo_in_a_flag_would_be_caught():
    """The parser this test trusts does refuse what SGLang does not know."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--disaggregation-mode", "prefil"])
