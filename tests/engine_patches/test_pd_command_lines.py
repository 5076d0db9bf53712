"""The disaggregated plan's launch commands (bench/model/pd/launch.py), parsed by SGLang 0.5.23's own ServerArgs
parser, and the router line by sglang-router's own parser (`launch_router.parse_router_args`), for the shapes the
Planner prints: one-node and multi-node instances, DP or TP attention on prefill, EPLB on and off."""

import argparse
import contextlib
import io
import shlex

import pytest
from sglang.srt.server_args import ServerArgs
from sglang_router.launch_router import parse_router_args

from bench.model.pd import disagg
from bench.model.pd import launch as disagg_launch
from bench.model.serving.slo import Slo


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


def test_a_campaigns_disaggregated_launches_parse():
    """What a campaign's `disaggregated:` deployment launches (bench/campaign/pd_launch.py): two prefill instances
    of two nodes each (tp 16 over 8-GPU nodes), a decode instance on a third node, the router; every node's line
    parses with SGLang's ServerArgs, the router's with sglang-router's parser, pointed at each instance's first node."""
    from bench.campaign import parse_campaign
    from bench.campaign.pd_launch import plan

    nodes = "".join(f"        g{k}: {{start: 'ssh g{k} {{command}}', host: g{k}}}\n" for k in range(5))
    c = parse_campaign(
        "name: pd\ndeployments:\n  - name: kimi\n    disaggregated:\n      model: kimi-k2-thinking\n"
        "      transfer: nixl\n      nodes:\n" + nodes +
        "      prefill: {count: 2, tp: 16, dp: 16, ep: 16, node: [g0, g1, g2, g3], flags: [--enable-eplb]}\n"
        "      decode: {tp: 8, dp: 8, ep: 8, node: g4, flags: [--max-running-requests, '1024']}\n"
        "      router: {node: g0, port: 8080}\n"
        "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n", inline_templates=True)
    parts = plan(c.deployments[0])
    assert [p.label for p in parts] == ["prefill[0].node0", "prefill[0].node1", "prefill[1].node0",
                                        "prefill[1].node1", "decode[0]", "router"]
    assert [p.host for p in parts] == ["g0", "g1", "g2", "g3", "g4", "g0"]
    for p in parts[:-1]:
        ns = sglang_parse(p.argv)
        assert ns.disaggregation_mode == p.role and ns.disaggregation_transfer_backend == "nixl"
        assert ns.kv_cache_dtype == "fp8_e4m3" and ns.host == "0.0.0.0" and ns.port == p.port
        assert ns.mem_fraction_static == pytest.approx(disagg.pd_mem_fraction("kimi-k2-thinking", "h200"), abs=1e-3)
        if p.role == "prefill":
            assert (ns.tp_size, ns.dp_size, ns.ep_size, ns.nnodes) == (16, 16, 16, 2) and ns.enable_eplb
            assert ns.dist_init_addr == f"g{2 * int(p.label[8])}:5000" and ns.node_rank == int(p.label[-1])
            assert ns.disaggregation_bootstrap_port == 8998
        else:
            assert (ns.tp_size, ns.dp_size, ns.ep_size, ns.nnodes) == (8, 8, 8, 1) and ns.max_running_requests == 1024
    args = parse_router_args(parts[-1].argv[3:])
    assert args.pd_disaggregation and args.port == 8080
    assert args.prefill_urls == [("http://g0:30000", 8998), ("http://g2:30000", 8998)]
    assert args.decode_urls == ["http://g4:30000"]


def wrapped_parse(argv: list[str]) -> argparse.Namespace:
    """A `capbench sglang-launch [patch flags] -- <server args>` line: the server command the launcher builds (its
    patches' own flags added), parsed by SGLang's ServerArgs."""
    from engine_patches.launch import PatchOptions, build_command

    assert argv[:2] == ["capbench", "sglang-launch"] and "--" in argv
    patch, server = argv[2:argv.index("--")], argv[argv.index("--") + 1:]
    flags = dict(zip(patch[::2], patch[1::2], strict=True))
    assert set(flags) <= {"--kv-checksum", "--kv-scales"}
    built, _ = build_command(PatchOptions(flags["--kv-checksum"], kv_scales=flags.get("--kv-scales")), server)
    return sglang_parse(["python", "-m", "sglang.launch_server", *built[3:]])


def test_with_patch_flags_the_plans_servers_go_through_the_patched_launcher():
    from bench.model.advice.launch import patch_flags
    from engine_patches.kv_checksum.patch import BACKEND

    shape = disagg.Shape("kimi-k2-thinking", "h200", 16, 8, "bf16")
    a = disagg.evaluate(shape, disagg.Lengths(2000, 0, 300, 2300), Slo(ttft_s=5, tpot_s=0.1), 10.0)
    launches = disagg_launch.commands(a, patches=patch_flags("bf16", "verify"))
    for x in launches[:-1]:
        argv = shlex.split(x.command)
        assert argv[:5] == ["capbench", "sglang-launch", "--kv-checksum", "verify", "--"]
        ns = wrapped_parse(argv)
        assert ns.disaggregation_mode == x.role and ns.radix_cache_backend == BACKEND
        assert ns.tp_size == (16 if x.role == "prefill" else 8) and ns.nnodes == (2 if x.role == "prefill" else 1)
    assert shlex.split(launches[-1].command)[:3] == ["python", "-m", "sglang_router.launch_router"]


def test_a_campaign_that_asks_for_patches_launches_its_pd_servers_through_them(tmp_path):
    """kv_checksum / kv_scales on a `disaggregated:` deployment: every prefill and decode node through `capbench
    sglang-launch` (the launcher's dry run accepts the line as given), the router as it was; without (a bare YAML
    `off`), SGLang's own."""
    import subprocess
    import sys

    from bench.campaign import parse_campaign
    from bench.campaign.pd_launch import plan
    from engine_patches.kv_checksum.patch import BACKEND

    scales = tmp_path / "scales.json"  # SGLang's schema, as calibrate-kv-scales writes it (checked before launch)
    scales.write_text('{"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.05}}}}')
    text = ("name: pd\ndeployments:\n  - name: kimi\n    disaggregated:\n      model: kimi-k2-thinking\n"
            f"      kv_checksum: strict\n      kv_scales: {scales}\n"
            "      prefill: {tp: 8, dp: 8, ep: 8}\n      decode: {tp: 8, dp: 8, ep: 8}\n      router: {}\n"
            "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n")
    parts = plan(parse_campaign(text, inline_templates=True).deployments[0])
    for p in parts[:-1]:
        assert p.argv[:2] == ["capbench", "sglang-launch"]
        ns = wrapped_parse(p.argv)
        assert ns.disaggregation_mode == p.role and ns.radix_cache_backend == BACKEND
        assert ns.quantization_param_path == str(scales) and ns.kv_cache_dtype == "fp8_e4m3"
    assert parts[-1].argv[:3] == ["python", "-m", "sglang_router.launch_router"]
    dry = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *parts[1].argv[1:2],
                          "--dry-run", *parts[1].argv[2:]], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "--disaggregation-mode decode" in dry.stdout, dry.stderr
    plain = plan(parse_campaign(text.replace("kv_checksum: strict", "kv_checksum: off").replace(
        f"      kv_scales: {scales}\n", ""), inline_templates=True).deployments[0])
    assert all(p.argv[:3] == ["python", "-m", "sglang.launch_server"] for p in plain[:-1])
