"""Every command line a user copies, parsed the way it will be parsed: each `capbench ...` line of the bash blocks
of README.md and every docs/*.md page through the CLI's own (click) parser, and for `capbench sglang-launch ... --
ARGS` also ARGS through SGLang 0.5.23's ServerArgs parser, after the launcher's own handling (which accepts `python -m
sglang.launch_server` in front). The launch commands reports and the Planner generate (bench/model/advice/launch.py)
too."""

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import click
import pytest
import typer
from sglang.srt.server_args import ServerArgs

from bench.cli import app
from bench.model import catalog
from bench.model import launch as sglang_cmd
from engine_patches.launch import PatchOptions, _server_int, build_command, int4_checkpoint_args, server_arguments

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def readme_commands(page: Path = README) -> list[str]:
    """capbench lines of a page's bash blocks, continuation lines joined, comments and `[...]` brackets
    (optional parts, written out) removed."""
    text = page.read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("capbench "):
                lines.append(shlex.join(shlex.split(line.replace("[", "").replace("]", ""), comments=True)))
    return lines


def sglang_parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"SGLang rejects {' '.join(args)}: {err.getvalue().strip().splitlines()[-1]}")


def capbench_parse(argv: list[str]) -> click.Context:
    """The CLI's own parser on `capbench CMD OPTIONS` (no command runs)."""
    group = typer.main.get_command(app)
    with group.make_context("capbench", argv[1:2]) as ctx:
        command = group.get_command(ctx, argv[1])
        assert command is not None, f"no command {argv[1]}"
        sub = command.make_context(argv[1], argv[2:], parent=ctx)
        assert not sub.args, f"{argv[1]} does not take {sub.args}"
        return sub


def check_line(line: str) -> argparse.Namespace | None:
    argv = shlex.split(line, comments=True)
    if argv[1] != "sglang-launch":
        capbench_parse(argv)
        return None
    cut = argv.index("--")
    capbench_parse(argv[:cut])
    server = server_arguments(argv[cut + 1:])
    assert server and server[0].startswith("--"), f"launch_server arguments expected after --: {line}"
    launched, _ = build_command(PatchOptions(), argv[cut + 1:])
    assert launched[1:3] == ["-m", "sglang.launch_server"] and launched.count("sglang.launch_server") == 1
    ns = sglang_parse(server + int4_checkpoint_args(server))
    # the launcher reads tp and ep as SGLang does (its INT4 group-size check depends on them)
    assert _server_int(server, ("--tp", "--tp-size", "--tensor-parallel-size"), 1) == ns.tp_size
    assert _server_int(server, ("--ep", "--ep-size", "--expert-parallel-size"), 1) == ns.ep_size
    return ns


PAGE_LINES = [(page.relative_to(ROOT).as_posix(), line) for page in PAGES for line in readme_commands(page)]
README_LINES = readme_commands()


def test_the_readme_and_docs_have_the_commands_they_document():
    assert len(PAGES) > 1, "docs/*.md pages expected beside README.md"
    commands = {shlex.split(line)[1] for _, line in PAGE_LINES}
    assert {"capacity", "plan", "simulate", "validate", "calibrate", "campaign", "serve", "demo", "twin", "run",
            "worker", "runs", "export", "drift", "report", "dashboard", "sglang-launch", "calibrate-kv-scales",
            "quantize-int4"} <= commands
    # the real-deployment tour in the README and the engine-patches page write SGLang's own command after --
    assert any("python -m sglang.launch_server" in line for line in README_LINES)
    assert any("python -m sglang.launch_server" in line for line in readme_commands(ROOT / "docs/engine-patches.md"))


@pytest.mark.parametrize("page,line", PAGE_LINES, ids=[f"{p}:{' '.join(shlex.split(x)[:2])}" for p, x in PAGE_LINES])
def test_readme_and_docs_command_parses(page, line):
    check_line(line)


def test_both_spellings_after_the_separator_launch_the_same_server():
    bare, _ = build_command(PatchOptions(), ["--model-path", "m", "--tp", "8"])
    for prefix in (["python", "-m", "sglang.launch_server"], ["python3", "-m", "sglang.launch_server"],
                   ["/usr/bin/python3.11", "-m", "sglang.launch_server"], ["-m", "sglang.launch_server"]):
        argv, _ = build_command(PatchOptions(), [*prefix, "--model-path", "m", "--tp", "8"])
        assert argv == bare


def test_the_duplicated_module_the_old_readme_produced_is_what_sglang_rejects():
    """Why server_arguments exists: passed through as-is, SGLang's parser refuses the module name."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit):
        parser.parse_args(["python", "-m", "sglang.launch_server", "--model-path", "m"])
    assert "unrecognized arguments" in err.getvalue() or "error" in err.getvalue()


GENERATED = [(m, g, tp, kv, w) for m in ("kimi-k2-thinking", "glm-4.6", "glm-4.5-air") for g in ("h200", "h100-sxm")
             for tp in (8, 16) for kv in ("bf16", "fp8_e4m3") for w in ("native", "int4-g32", "int4-g128")]


@pytest.mark.parametrize("model,gpu,tp,kv,weights", GENERATED)
def test_report_launch_commands_parse(model, gpu, tp, kv, weights):
    single, multi = sglang_cmd.commands(model, gpu, tp, kv, weights, catalog.model(model).max_context)
    for line in ([single] if single else []) + multi:
        ns = check_line(line)
        assert ns.tp_size >= tp and ns.kv_cache_dtype == sglang_cmd.KV_FLAGS[kv]
        if weights.startswith("int4"):
            from engine_patches.int4_moe.layout import check_group_size

            m = catalog.model(model)
            check_group_size(int(weights.removeprefix("int4-g")), m.moe_intermediate_size, m.hidden_size,
                             ns.tp_size, ns.ep_size)
            assert ns.disable_shared_experts_fusion == (m.architecture == "Glm4MoeForCausalLM")
