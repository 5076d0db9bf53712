"""The expert-format catalog (data/expert_formats.yaml) against the installed SGLang 0.5.23, the planner's search
over it (every recommendation obtainable), and `capbench formats` as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import sglang

from bench.model import Question, capacity, catalog, formats, make_plan
from bench.model.advice.option import obtainable

SRT = Path(sglang.__file__).parent / "srt"
CAPBENCH = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "capbench"


def test_every_kernel_named_is_a_file_of_the_installed_sglang():
    assert sglang.__version__ == formats.catalog().sglang
    for name in formats.names():
        for arch, k in formats.get(name).kernels.items():
            assert arch in formats.catalog().archs
            assert (SRT / k.file).is_file(), (name, arch, k.file)


def test_bytes_per_weight_are_the_formats_own_arithmetic():
    assert capacity.bytes_per_weight("bf16") == 2.0
    assert capacity.bytes_per_weight("fp8-block128") == 1 + 4 / (128 * 128)  # one fp32 per 128x128 block
    for g in (32, 128):
        assert capacity.bytes_per_weight(f"int4-g{g}") == 0.5 + 2 / g  # one bf16 per group
    assert capacity.bytes_per_weight("nvfp4") == capacity.bytes_per_weight("nvfp4-w4a16") == 0.5 + 1 / 16
    assert capacity.bytes_per_weight("mxfp4") == 0.5 + 1 / 32  # one UE8M0 byte per 32
    assert capacity.bytes_per_weight("w4a8-g128") == 0.5 + 4 / 128  # fp32 group scales (w4afp8.py)


def test_what_each_gpu_searches():
    kimi, glm = catalog.model("kimi-k2-thinking"), catalog.model("glm-4.6")
    h200, b200, mi300x = catalog.gpu("h200"), catalog.gpu("b200"), catalog.gpu("mi300x")
    # Hopper runs NVFP4 W4A4 weight-only (FP4 Marlin): priced as Kimi's native INT4 g32, so not searched twice
    assert formats.compute("nvfp4", "sm90") == "wna16" and formats.compute("nvfp4", "sm100") == "fp4"
    assert "nvfp4" not in formats.searched(kimi, h200) and "nvfp4" in formats.searched(kimi, b200)
    assert not any(w.startswith(("nvfp4", "mxfp4")) for w in formats.searched(glm, mi300x))  # no FP4 kernel
    for gpu in (h200, b200, mi300x):
        for model in (kimi, glm):
            assert "nf4" not in formats.searched(model, gpu) and "w4a8-g128" not in formats.searched(model, gpu)
            assert not any(w.startswith("mxfp4") for w in formats.searched(model, gpu))  # not loaded for them
    assert formats.source_of(glm, "fp8").hf == "zai-org/GLM-4.6-FP8"
    assert formats.source_of(kimi, "nvfp4").hf == "nvidia/Kimi-K2-Thinking-NVFP4"
    assert formats.source_of(kimi, "fp8-block128").kind == "capbench"
    assert formats.source_of(kimi, "w4a8-g128") is None


PLANS = {
    "kimi-h200": Question(model="kimi-k2-thinking", gpu="h200", tp=8, workload="chat", target_rate_rps=20.0,
                          search_gpus=("h200",)),
    "kimi-b200": Question(model="kimi-k2-thinking", gpu="b200", tp=8, workload="chat", target_rate_rps=20.0,
                          search_gpus=("b200",)),
    # GLM with a chosen format nobody ships nor makes: shown, never recommended
    "glm-h200": Question(model="glm-4.6", gpu="h200", tp=8, workload="chat", target_rate_rps=20.0,
                         search_gpus=("h200",), weights="w4a8-g128"),
}


@pytest.fixture(scope="module", params=list(PLANS))
def plan(request):
    return request.param, make_plan(PLANS[request.param], workers=2)


def test_every_recommendation_is_obtainable(plan):
    name, p = plan
    q = PLANS[name]
    model, gpu = catalog.model(q.model), catalog.gpu(q.gpu)
    assert p.recommended is not None and obtainable(q.model, p.recommended.config)
    assert p.recommended.checkpoint != "not obtainable"
    searched = set(formats.searched(model, gpu))
    for o in p.options:
        assert o.chosen or o.weights in searched  # only the asked-for configuration may lie outside the search
        if o.recommended or o.pareto or o.pareto_cost:
            assert o.weights in searched
    rows = [o.to_row() for o in p.options if o.simulated]
    assert all(r["checkpoint"] for r in rows)


@pytest.mark.parametrize("plan", ["glm-h200"], indirect=True)
def test_a_chosen_format_nobody_ships_is_shown_but_never_recommended(plan):
    _, p = plan
    assert p.chosen.weights == "w4a8-g128" and not p.chosen.recommended
    assert p.chosen.checkpoint == "not obtainable"
    assert any("never recommended" in n and "not obtainable" in n for n in p.notes)


def capbench_formats(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CAPBENCH), "formats", *args], capture_output=True, text=True, timeout=900, cwd=cwd)


def test_capbench_formats_answers_for_glm_on_b200(tmp_path):
    p = capbench_formats("--model", "glm-4.6", "--gpu", "b200", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {r["format"]: r for r in json.loads(p.stdout)}
    assert list(rows) == formats.names()
    nf4 = rows["nf4"]
    assert nf4["status"] == "not served" and "dequantize_4bit" in nf4["kernel"] and nf4["priced"] is None
    assert "every forward" in nf4["why_not"]
    fp4 = rows["nvfp4"]
    assert fp4["status"] == "searched" and fp4["priced"]["method"] and fp4["obtainable"]
    assert "W4A4" in fp4["name"] and fp4["kernel_file"].endswith("compressed_tensors_w4a4_nvfp4_moe.py")
    assert rows["fp8-block128"]["weights"] == "fp8" and rows["fp8-block128"]["checkpoint"].startswith("zai-org/")
    assert rows["mxfp4"]["status"] == "not loaded" and rows["w4a8-g128"]["status"] == "no kernel"
    for r in rows.values():
        assert r["fits"] and r["weight_gb_per_gpu"] > 0 and r["context"] == catalog.model("glm-4.6").max_context
        assert r["accuracy"]
    # the same sizes as `capbench capacity` for the same deployment
    dep = capacity.Deployment(catalog.model("glm-4.6"), catalog.gpu("b200"), 8, 1, "fp8_e4m3", "nvfp4")
    assert capacity.capacity(dep).kv_pool_tokens_total == fp4["kv_pool_tokens"]


def test_capbench_formats_refuses_an_unknown_model_in_one_line(tmp_path):
    p = capbench_formats("--model", "nope", "--gpu", "h200", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "unknown model 'nope'" in p.stderr
