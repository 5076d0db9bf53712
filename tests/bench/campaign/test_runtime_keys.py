"""`python:` (the SGLang interpreter) and `image:` (a container) in a campaign file, campaign-wide or per deployment:
checked (one line per bad value), filled into the template's {python} / {image} quoted, a plain SGLang launch under
the named interpreter where no capbench patch is needed, and refused on `capbench serve` unless the operator's
template names them."""

import subprocess
import sys

import pytest

from bench.campaign import operator_templates, parse_campaign
from bench.campaign.launch import launch_command
from bench.campaign.templates import runtime
from bench.errors import BadInput

CLI = [sys.executable, "-c", "from bench.cli import main; main()", "campaign"]


def _spec(top: str = "", sglang: str = "", template: str = "'ssh gpu7 {command}'") -> str:
    return (f"name: r\nslo: \"ttft=30s\"\n{top}deployments:\n"
            f"  - {{name: a, sglang: {{model: glm-4.6, tp: 8{sglang}, template: {{start: {template}}}}}}}\n"
            f"  - {{name: b, sglang: {{model: glm-4.6, tp: 8, kv_checksum: verify, python: /opt/other/python, "
            f"template: {{start: {template}}}}}}}\n"
            "loads:\n  - {name: x, workload: chat, sweep: {start: 1}}\n")


def test_campaign_wide_python_is_each_deployments_default_and_picks_the_launch():
    c = parse_campaign(_spec(top="python: /opt/sglang/.venv/bin/python\n"), inline_templates=True)
    a, b = c.deployments
    assert runtime(a) == ("/opt/sglang/.venv/bin/python", None) and runtime(b) == ("/opt/other/python", None)
    plain = launch_command(a, 30000, "0.0.0.0", runtime(a)[0])
    assert plain[:3] == ["/opt/sglang/.venv/bin/python", "-m", "sglang.launch_server"]
    assert plain[plain.index("--tp") + 1] == "8" and "sglang-launch" not in plain
    patched = launch_command(b, 30000, "0.0.0.0", runtime(b)[0])  # the checksum needs capbench's patches
    assert patched[:6] == ["/opt/other/python", "-m", "bench.cli", "sglang-launch", "--kv-checksum", "verify"]
    assert launch_command(a, 30000)[:2] == ["capbench", "sglang-launch"]  # no python named: as before


def test_an_image_runs_through_a_template_that_places_it():
    c = parse_campaign(_spec(top="image: lmsysorg/sglang:v0.5.3-cu129\n",
                             template="'docker run --rm --gpus all --network host {image} {command}'"),
                       inline_templates=True)
    a, b = c.deployments
    assert runtime(a) == ("python3", "lmsysorg/sglang:v0.5.3-cu129")  # the image's own interpreter
    assert runtime(b) == ("/opt/other/python", "lmsysorg/sglang:v0.5.3-cu129")
    with pytest.raises(BadInput) as e:
        parse_campaign(_spec(top="image: lmsysorg/sglang:v0.5.3\n"), inline_templates=True)
    assert "deployments[0].sglang.image: a container image runs through a template whose start places {image}" \
        in str(e.value)
    with pytest.raises(BadInput, match=r"start places \{image\} but no image is named"):
        parse_campaign(_spec(template="'docker run {image} {command}'"), inline_templates=True)


@pytest.mark.parametrize(("key", "value", "where"), [
    ("python", "'/opt/py; rm -rf /'", "python"),
    ("python", "-c", "python"),
    ("image", "'img $(touch x)'", "image"),
    ("python", "'$HOME/py'", "deployments[0].sglang.python"),
])
def test_a_bad_interpreter_or_image_is_one_line(tmp_path, key, value, where):
    text = _spec(top=f"{key}: {value}\n") if "." not in where else _spec(sglang=f", {key}: {value}")
    f = tmp_path / "c.yaml"
    f.write_text(text)
    out = subprocess.run([*CLI, str(f), "--check"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = [x for x in out.stderr.splitlines() if x.startswith(f"{where}:")]
    assert len(lines) == 1 and ("interpreter" in lines[0] or "container image" in lines[0]), out.stderr
    assert not (tmp_path / "x").exists()


def test_on_serve_the_operators_template_names_them_and_a_queued_campaign_may_not(tmp_path):
    ops = tmp_path / "templates.yaml"
    ops.write_text("gpu-box: {start: 'ssh gpu7 docker run --rm --gpus all --network host {image} {command}', "
                   "host: gpu7, image: lmsysorg/sglang:v0.5.3-cu129}\n")
    templates = operator_templates(ops)
    named = ("name: q\nslo: \"ttft=30s\"\ndeployments:\n  - {name: a, sglang: {model: glm-4.6, tp: 8, "
             "template: gpu-box}}\nloads:\n  - {name: x, workload: chat, sweep: {start: 1}}\n")
    dep = parse_campaign(named, "q.yaml", templates).deployments[0]
    assert runtime(dep) == ("python3", "lmsysorg/sglang:v0.5.3-cu129")
    for extra in ("python: /tmp/evil\n", "image: evil/image\n"):
        with pytest.raises(BadInput, match="refused: a campaign queued on capbench serve does not choose what runs"):
            parse_campaign(extra + named, "q.yaml", templates)
    bad = tmp_path / "bad.yaml"
    bad.write_text("t: {start: 'x {command}', python: 'a b'}\n")
    with pytest.raises(BadInput, match=r"t.python: a path or name of a Python interpreter"):
        operator_templates(bad)

