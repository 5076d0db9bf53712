"""Flags are parsed, not matched: each role's flags go through SGLang 0.5.23's launch parser (the option table,
checked here against ServerArgs.add_cli_args itself), so an abbreviation SGLang resolves (`--api-ke K`,
`--disaggregation-mo decode`) is judged by the field it sets: owned fields refused, secret fields only as env:NAME,
resolved inside the server's process for colocated and disaggregated roles alike; SGLang's own logging of its
server_args reaches the kept log with the key as ***."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.campaign import flags, parse_campaign
from bench.campaign.pd_launch import plan
from bench.errors import BadInput

sys.path.insert(0, str(Path(__file__).parent))
from sglang_server_args import TABLE, sglang_parser, table  # noqa: E402

CAPBENCH = str(Path(sys.executable).parent / "capbench")
KEY = "sk-live-Flag/Key+0123456789abcdef"
BASE = """name: t
slo: "ttft=10s,tpot=200ms"
duration: 2
deployments:
  - {name: d, sglang: {model: glm-4.6, tp: 8, template: {start: 'true {command}'}, flags: FLAGS}}
loads:
  - {name: a, workload: chat, profile: poisson, rate: 1}
"""
PD = """name: t
slo: "ttft=10s,tpot=200ms"
duration: 2
deployments:
  - name: pd
    disaggregated:
      model: glm-4.6
      nodes: {g1: {start: 'true {command}', host: 10.0.0.1}}
      prefill: {count: 1, tp: 8, node: g1, flags: PREFILL}
      decode: {count: 1, tp: 8, node: g1, flags: DECODE}
      router: {node: g1}
loads:
  - {name: a, workload: chat, profile: poisson, rate: 1}
"""
REFUSED = {  # flags -> (the field SGLang sets, what the one line says)
    f"[--api-ke, '{KEY}']": ("api_key", "--api-ke takes env:NAME"),
    f"[--admin-api-k, '{KEY}']": ("admin_api_key", "--admin-api-k takes env:NAME"),
    f"[--ssl-keyfile-pass, '{KEY}']": ("ssl_keyfile_password", "--ssl-keyfile-pass takes env:NAME"),
    f"['--api-key={KEY}']": ("api_key", "--api-key takes env:NAME"),
    "[--disaggregation-mo, decode]": ("disaggregation_mode", None),
    "[--model, other/model]": ("model_path", "--model sets model_path, which the campaign's own keys set"),
    "[--tensor-parallel-size, '4']": ("tp_size", "sets tp_size"),
    "[--kv-cache-dt, fp8_e5m2]": ("kv_cache_dtype", "--kv-cache-dt sets kv_cache_dtype"),
    "[--config, /etc/x.yaml]": ("config", "--config reads fields from a file capbench cannot check"),
    "[--help]": ("help", "--help prints SGLang's help"),
    "[--mem-fraction-stat, '0.8']": ("mem_fraction_static", "--mem-fraction-stat is SGLang's --mem-fraction-static "
                                     "abbreviated; write it in full"),
}


def test_the_table_is_sglangs_own_parser():
    doc = json.loads(TABLE.read_text())
    assert doc["version"] == "0.5.23" and doc["options"] == table(sglang_parser())


@pytest.mark.parametrize("given", sorted(REFUSED))
def test_a_flag_is_judged_by_the_field_sglang_sets(given):
    field, says = REFUSED[given]
    argv = [str(x) for x in __import__("yaml").safe_load(given)]
    if field not in ("help",):  # what SGLang itself reads these flags as
        parsed = vars(sglang_parser().parse_args(["--model-path", "m", *argv] if field != "model_path" else argv))
        assert parsed[field] not in (None, False)
    with pytest.raises(BadInput) as e:
        parse_campaign(BASE.replace("FLAGS", given), inline_templates=True)
    if says:
        assert says in str(e.value)
    assert KEY not in str(e.value)


def test_an_abbreviated_owned_flag_is_refused_on_every_disaggregated_role():
    for role in ("PREFILL", "DECODE"):
        text = PD.replace(role, "[--disaggregation-mo, decode]").replace("PREFILL", "[]").replace("DECODE", "[]")
        with pytest.raises(BadInput, match=f"{role.lower()}.flags: --disaggregation-mo sets disaggregation_mode"):
            parse_campaign(text, inline_templates=True)
    text = PD.replace("PREFILL", f"[--api-ke, '{KEY}']").replace("DECODE", "[]")
    with pytest.raises(BadInput, match="prefill.flags: --api-ke takes env:NAME"):
        parse_campaign(text, inline_templates=True)
    router = PD.replace("PREFILL", "[]").replace("DECODE", "[]").replace("router: {node: g1}",
                                                                            "router: {node: g1, flags: [--pd-dis]}")
    with pytest.raises(BadInput, match="router.flags: --pd-dis is set by the campaign's own keys"):
        parse_campaign(router, inline_templates=True)


def test_env_secrets_go_through_the_launcher_on_every_role():
    """A disaggregated role's --api-key env:NAME is filled in by `capbench sglang-launch`, never launched as the
    literal string; colocated launches already go through it."""
    text = PD.replace("PREFILL", "[--api-key, 'env:MYKEY']").replace("DECODE", "['--api-key=env:MYKEY']")
    dep = parse_campaign(text, inline_templates=True).deployments[0]
    for part in plan(dep)[:-1]:
        assert part.argv[:2] == ["capbench", "sglang-launch"], part.argv
        assert "env:MYKEY" in " ".join(part.argv) and "MYKEY" == flags.secret_env(part.argv[part.argv.index("--")
                                                                                             + 1:])


def test_the_cli_check_says_one_line_and_never_the_key(tmp_path):
    for given in (f"[--api-ke, '{KEY}']", "[--disaggregation-mo, decode]"):
        f = tmp_path / "c.yaml"
        f.write_text(BASE.replace("FLAGS", given))
        out = subprocess.run([CAPBENCH, "campaign", str(f), "--check", "--db", str(tmp_path / "x.duckdb")],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 2 and KEY not in out.stdout + out.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text(BASE.replace("FLAGS", "[--api-key, 'env:CB_KEY', --mem-fraction-static, '0.8']"))
    out = subprocess.run([CAPBENCH, "campaign", str(ok), "--check", "--db", str(tmp_path / "x.duckdb")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_sglangs_logging_of_its_server_args_keeps_no_key(tmp_path):
    """The server's output (every process of it, stdout and stderr) reaches the log with the key as ***."""
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import logging, subprocess, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "k = sys.argv[sys.argv.index('--api-key') + 1]\n"
        "logging.info('server_args=%r', {'api_key': k, 'admin_api_key': sys.argv[-1]})\n"
        "print('ready', k == sys.argv[-1], flush=True)\n"
        "subprocess.run([sys.executable, '-c', f'import sys; print({k!r}); print({k!r}, file=sys.stderr)'])\n")
    from engine_patches.launch import PatchOptions, build_command

    argv, env = build_command(PatchOptions(), ["--model-path", "m", "--api-key", "env:CB_K",
                                               "--admin-api-key=env:CB_K"])
    key = "sk-it's\\a/Key+0123456789"
    env = {**env, "CB_K": key, "PYTHONPATH": f"{fake.parent}{os.pathsep}{env['PYTHONPATH']}"}
    log = tmp_path / "server.log"
    with log.open("w") as out:
        assert subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=60).returncode == 0
    text = log.read_text()
    assert "ready False" in text and "server_args=" in text and text.count("***") >= 4, text
    assert key not in text and repr(key)[1:-1] not in text and "0123456789" not in text
