"""The `disaggregated:` deployment of a campaign file: every problem one line; on `capbench serve` its nodes name
the operator's templates and no role runs on the service's host; `--check` runs each role's memory arithmetic and
a decode rank's KV pool against each load (one line per problem, exit 2, nothing launched); the predicted column
is the PD simulator's (bench/model/pd/simulate.py) playing the same sweep."""

import subprocess

import pytest

from bench.campaign import parse_campaign
from bench.campaign.pd_check import shape
from bench.campaign.predict import fit_problems, modelled, predicted
from bench.campaign.run import _search
from bench.campaign.templates import Template
from bench.errors import BadInput
from bench.model import load_workload, usd_per_million
from bench.model.pd import disagg
from bench.model.pd import simulate as pd_simulate
from bench.sweep import sweep
from tests.bench.campaign.test_predict import CLI

NODES = ("      nodes:\n        g1: {start: 'ssh g1 {command}', host: g1}\n"
         "        g2: {start: 'ssh g2 {command}', host: g2}\n")


def _file(roles: str, nodes: str = NODES, top: str = "", load: str = "sweep: {start: 0.5}") -> str:
    return ("name: pd\nslo: \"ttft=4s,tpot=100ms\"\ndeployments:\n  - name: kimi-pd\n    disaggregated:\n"
            f"      model: kimi-k2-thinking\n      kv_dtype: fp8_e4m3\n{top}{nodes}{roles}"
            f"loads:\n  - {{name: x, workload: campaign-prefill-heavy, {load}}}\n")


ROLES = ("      prefill: {tp: 8, dp: 8, ep: 8, node: g1}\n      decode: {tp: 8, dp: 8, ep: 8, node: g2}\n"
         "      router: {node: g1}\n")


def _parse(text: str, **kw):
    return parse_campaign(text, **{"inline_templates": True, **kw})


def _problems(text: str, **kw) -> list[str]:
    with pytest.raises(BadInput) as e:
        _parse(text, **kw)
    return str(e.value).splitlines()[1:]


def test_every_problem_is_one_line():
    lines = _problems(_file(
        "      prefill: {tp: 8, dp: 3, node: g9, colour: red}\n"
        "      decode: {count: 2, tp: 8, node: [g1, g2, g1], flags: [--disaggregation-mode, prefill]}\n"
        "      router: {node: g1, tp: 2}\n", top="      transfer: tcp\n"))
    where = "deployments[0].disaggregated"
    assert lines == [
        f"{where}.transfer: 'tcp' is not one of mooncake, nixl",
        f"{where}.prefill.colour: unknown key (known: bootstrap_port, count, dp, ep, flags, node, port, tp)",
        f"{where}.prefill: dp and ep must divide tp (tp 8, dp 3, ep 1)",
        f"{where}.prefill.node: no node named 'g9' (nodes: g1, g2)",
        f"{where}.decode.flags: --disaggregation-mode sets disaggregation_mode, which the campaign's own keys set; "
        "use those",
        f"{where}.decode.node: 3 names for 2 launches (2 instance(s) of 1 node(s)); give one name, or one per launch",
        f"{where}.router.tp: unknown key (known: flags, node, port)",
    ], lines


def test_on_serve_nodes_name_the_operators_templates_and_nothing_runs_on_its_host():
    lines = _problems(_file(ROLES.replace("      router: {node: g1}\n", "      router: {}\n")), inline_templates=False)
    assert [x.split(":")[0] for x in lines] == ["deployments[0].disaggregated.nodes.g1",
                                                "deployments[0].disaggregated.nodes.g2",
                                                "deployments[0].disaggregated.router.node"], lines
    assert "refused" in lines[0] and "refused" in lines[2]
    named = "      nodes: {g1: gpu-a, g2: gpu-b}\n"
    one = {"gpu-a": Template("x {command}")}
    assert "no launch template named 'gpu-b'" in _problems(_file(ROLES, named), templates=one)[0]
    ops = {"gpu-a": Template("srun -w a {command}", host="a"), "gpu-b": Template("srun -w b {command}", host="b")}
    dep = parse_campaign(_file(ROLES, named), templates=ops).deployments[0]
    assert dep.pd.nodes == {"g1": ops["gpu-a"], "g2": ops["gpu-b"]} and dep.gpus == 16


def test_check_runs_each_roles_memory_arithmetic_and_the_decode_pool_against_each_load(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(_file("      prefill: {tp: 2, dp: 2, ep: 2, node: g1}\n"
                       "      decode: {tp: 8, dp: 8, ep: 8, node: g2, flags: [--max-running-requests, '100000']}\n"
                       "      router: {node: g1}\n"))
    out = subprocess.run([*CLI, str(f), "--check"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = [x for x in out.stderr.splitlines() if x.startswith("deployments[")]
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("deployments[0] (kimi-pd) prefill:") and "does not fit 2x h200" in lines[0]
    assert lines[1].startswith("deployments[0] (kimi-pd) decode: a decode rank's batch of 12,500 requests")
    assert "set --max-running-requests to at most" in lines[1]
    fine = _parse(_file(ROLES))
    assert fit_problems(fine) == []
    # a decode rank whose pool (5,824 tokens at this fraction) cannot hold the mix's longest request
    small = _parse(_file(ROLES.replace("node: g2}", "node: g2, flags: [--mem-fraction-static, '0.58']}")))
    assert fit_problems(small) == ["deployments[0] (kimi-pd) decode: a decode rank's KV pool of 5,824 tokens cannot "
                                   "hold the longest request of load x (12,687 tokens)"]


def test_the_predicted_column_is_the_pd_simulators_sweep():
    c = _parse(_file(ROLES))
    dep, load = c.deployments[0], c.loads[0]
    d, why = modelled(dep)
    assert why == "" and d.tp == 8 and d.dp == 8
    got = predicted(dep, load, _search(load))
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3", eplb=False, two_batch_overlap=False)
    wl = load_workload(load.workload)
    horizon = 1.25 * load.duration_s

    def stage(rate: float):
        from bench.campaign.stage import Stage

        p = pd_simulate.run(shape, wl, rate, max(1, int(rate * horizon + 0.999)), min_seconds=horizon)
        met = load.slo.met(p)
        return Stage(rate, "", {"slo_attainment": 1.0 if met else 0.0, "output_tps": p.output_tok_s}, met, "")

    from dataclasses import replace

    want = sweep(stage, replace(_search(load), max_stages=40)).best
    assert got["predicted_rps"] == pytest.approx(want.rate) and got["predicted_rps"] > 0
    # a second prefill instance takes half of the prefill-heavy load: at least as high a rate within the SLO
    two = _parse(_file(ROLES.replace("prefill: {tp", "prefill: {count: 2, tp")))
    got2 = predicted(two.deployments[0], load, _search(load))
    assert "not_predicted" not in got2 and got2["predicted_rps"] >= got["predicted_rps"]
    assert got2["predicted_usd_per_m"] == pytest.approx(
        usd_per_million(disagg.catalog.gpu("h200").price_per_gpu_hour, 24, got2["predicted_output_tps"]))


def test_the_static_memory_fraction_and_max_running_requests_are_modelled_per_role():
    flags = "flags: [--mem-fraction-static, '0.7', --max-running-requests, '64'], "
    c = _parse(_file(ROLES.replace("decode: {tp", "decode: {" + flags + "tp")))
    s, why = shape(c.deployments[0])
    assert why == "" and s.mem_fraction == (None, 0.7) and s.max_running == (None, 64)
    default = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3", eplb=False, two_batch_overlap=False)
    assert disagg.decode_pool(s).tokens_per_rank < disagg.decode_pool(default).tokens_per_rank
    assert disagg.decode_pool(s).max_running_per_rank == 64 // 8
    odd = _parse(_file(ROLES.replace("decode: {tp", "decode: {flags: [--chunked-prefill-size, '4096'], tp")))
    assert shape(odd.deployments[0]) == (None, "not predicted: the PD model does not model --chunked-prefill-size")


def test_the_built_in_example_checks_and_is_predicted():
    from bench.campaign import load_campaign

    c = load_campaign("pd-launch")
    dep = c.deployments[0]
    assert dep.kind == "disaggregated" and fit_problems(c) == []
    assert modelled(dep)[1] == "" and dep.gpus == 16
    assert {n: t.host for n, t in dep.pd.nodes.items()} == {"gpu1": "gpu1", "gpu2": "gpu2"}
