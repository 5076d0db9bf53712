"""Before anything launches: every deployment that cannot fit its GPUs is one line of `campaign --check` (exit 2),
and a run refuses it too; predictions model the SGLang flags they can and say "not predicted" for the rest."""

import subprocess
import sys
from dataclasses import replace

from bench.campaign import load_campaign, parse_campaign
from bench.campaign.predict import fit_problems, modelled, predicted
from bench.campaign.run import _search
from bench.model.fits.capacity import capacity

CLI = [sys.executable, "-c", "from bench.cli import main; main()", "campaign"]


def _spec(deployments: str, extra_load: str = "") -> str:
    return ("name: p\nslo: \"ttft=30s,tpot=300ms\"\nduration: 3\ndeployments:\n" + deployments
            + f"loads:\n  - {{name: x, workload: campaign-long-context, sweep: {{start: 0.2}}{extra_load}}}\n")


FIT = _spec("  - {name: kimi-tp2, sglang: {model: kimi-k2-thinking, tp: 2, template: "
            "{start: 'touch LAUNCHED; {command}'}}}\n"
            "  - {name: kimi-tp8, sglang: {model: kimi-k2-thinking, tp: 8}}\n"
            "  - {name: glm-twin, twin: 'glm-4.6@h200x2'}\n")


def test_check_names_every_deployment_that_cannot_fit(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(FIT)
    for args in (["--check"], ["--db", str(tmp_path / "c.duckdb")]):
        out = subprocess.run([*CLI, str(f), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        lines = [x for x in out.stderr.splitlines() if x.startswith("deployments[")]
        assert [x.split(" ")[0] for x in lines] == ["deployments[0]", "deployments[2]"], out.stderr
        assert "kimi-tp2" in lines[0] and "does not fit 2x h200" in lines[0] and "GiB" in lines[0]
    assert not (tmp_path / "LAUNCHED").exists() and not (tmp_path / "c.duckdb").exists()  # nothing launched


def test_predictions_model_the_flags_they_can():
    c = parse_campaign(_spec(
        "  - {name: plain, sglang: {model: kimi-k2-thinking, tp: 8}}\n"
        "  - {name: frac, sglang: {model: kimi-k2-thinking, tp: 8, flags: [--mem-fraction-static, '0.65']}}\n"
        "  - {name: page, sglang: {model: kimi-k2-thinking, tp: 8, flags: ['--page-size=64', --max-running-requests,"
        " '32', --context-length, '65536', --enable-metrics]}}\n"
        "  - {name: chunk, sglang: {model: kimi-k2-thinking, tp: 8, flags: [--chunked-prefill-size, '4096']}}\n"),
        inline_templates=True)  # the user's own file on the CLI, where SGLang may launch on this host
    plain, frac, page, chunk = (modelled(d) for d in c.deployments)
    assert plain[1] == frac[1] == page[1] == "" and frac[0].mem_fraction == 0.65
    assert (page[0].page_size, page[0].max_running, page[0].context) == (64, 32, 65536)
    assert capacity(frac[0]).kv_pool_tokens < capacity(plain[0]).kv_pool_tokens  # the flag is in the prediction
    assert chunk[0] is None and "--chunked-prefill-size" in chunk[1]
    load = c.loads[0]
    p = predicted(c.deployments[3], load, _search(load))
    assert p["predicted_rps"] is None and p["not_predicted"].startswith("not predicted")
    assert fit_problems(c) == []


def test_repeats_are_checked():
    c = parse_campaign(_spec("  - {name: t, twin: 'glm-4.6@h200x8'}\n", ", repeats: 3"))
    assert c.loads[0].repeats == 3
    for bad in ("0", "21", "2.5", "true"):
        try:
            parse_campaign(_spec("  - {name: t, twin: 'glm-4.6@h200x8'}\n", f", repeats: {bad}"))
        except Exception as e:  # noqa: BLE001 (BadInput, one line per problem)
            assert "loads[0].repeats: a whole number from 1 to 20" in str(e)
        else:
            raise AssertionError(f"repeats: {bad} passed")


def test_workload_paths_resolve_against_the_campaign_file(tmp_path):
    (tmp_path / "wl").mkdir()
    (tmp_path / "wl" / "mine.yaml").write_text(
        "name: mine\ntype: synthetic\ninput: {dist: fixed, value: 100}\noutput: {dist: fixed, value: 20}\n")
    f = tmp_path / "c.yaml"
    f.write_text("name: rel\nslo: \"ttft=10s\"\ndeployments:\n  - {name: t, twin: 'glm-4.6@h200x8'}\n"
                 "loads:\n  - {name: a, workload: wl/mine.yaml, profile: poisson, rate: 1}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([*CLI, str(f), "--check"], capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert out.returncode == 0 and "no problem found" in out.stdout, out.stderr
    c = parse_campaign(f.read_text(), str(f))
    assert c.loads[0].workload == str((tmp_path / "wl" / "mine.yaml").resolve())


def test_a_capped_load_is_predicted_behind_its_cap():
    """max_concurrency reaches the load generator and the prediction: 1 in flight serves less than no cap."""
    dep = "  - {name: t, twin: 'glm-4.6@h200x8'}\n"
    free, capped = (parse_campaign(_spec(dep, extra)) for extra in ("", ", max_concurrency: 1"))
    assert capped.loads[0].max_concurrency == 1 and free.loads[0].max_concurrency is None
    p_free, p_cap = (predicted(c.deployments[0], c.loads[0], _search(c.loads[0])) for c in (free, capped))
    assert 0 < p_cap["predicted_rps"] < p_free["predicted_rps"]
    for extra, why in ((", max_concurrency: 0", "loads[0].max_concurrency: must be positive"),
                       (", profile: users, users: 4, max_concurrency: 2", "a users load holds its users")):
        try:
            parse_campaign(_spec(dep, extra))
        except Exception as e:  # noqa: BLE001 (BadInput, one line per problem)
            assert why in str(e), str(e)
        else:
            raise AssertionError(f"{extra} passed")


def test_a_disaggregated_deployment_under_a_capped_load_is_predicted_behind_its_cap():
    """pd-demo's PD twin under max_concurrency is a number now (the PD simulator plays the client's cap): tighter caps
    serve less, a cap far above the load predicts what no cap does; the colocated twin's capped answers behave as
    they did (its simulator took the cap before)."""
    c = load_campaign("pd-demo")
    load = c.loads[0]
    for name in ("disaggregated", "colocated"):
        answers = [predicted(c.deployment(name), replace(load, max_concurrency=cap), _search(load))
                   for cap in (1, 4, 10**6, None)]
        assert all("not_predicted" not in a for a in answers), answers
        rps = [a["predicted_rps"] for a in answers]
        assert 0 < rps[0] < rps[1] < rps[3] and rps[2] == rps[3], (name, rps)
        assert answers[0]["predicted_usd_per_m"] > answers[3]["predicted_usd_per_m"]
