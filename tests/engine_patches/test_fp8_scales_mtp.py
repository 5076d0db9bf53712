"""FP8 KV scales for the MTP / NextN draft layer, with SGLang's real draft model classes (nextn_worker.py).

SGLang numbers the draft's one decoder layer 0. Before: the loader gave it layer 0's scale and the recorder filed
its maxima under layer 0. Now: it is the checkpoint's layer num_hidden_layers for both, and without a recorded
draft scale it keeps SGLang's default 1.0."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_patches.fp8_scales.scales_file import build_scales, read_draft_scales, write_scales
from tests.engine_patches.int4_checkpoints import LAYERS, make_checkpoint

WORKER = Path(__file__).with_name("nextn_worker.py")
AMAX = {0: (100.0, 50.0), 1: (900.0, 40.0), 2: (2000.0, 30.0), LAYERS: (3000.0, 60.0)}  # LAYERS: the draft layer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    for kind in ("glm", "kimi-fp8"):
        make_checkpoint(root / kind, kind)
        config = json.loads((root / kind / "config.json").read_text())
        config["num_nextn_predict_layers"] = 1
        config.pop("quantization_config", None)
        (root / kind / "config.json").write_text(json.dumps(config))
    files = {}
    for layout in ("mha", "mla"):
        files[layout] = str(write_scales(build_scales(layout, AMAX, LAYERS, 1), root / f"{layout}.json"))
        no_draft = {k: v for k, v in AMAX.items() if k < LAYERS}
        files[layout + "-no-draft"] = str(write_scales(build_scales(layout, no_draft, LAYERS, 1),
                                                       root / f"{layout}-no-draft.json"))
    cases = [
        {"name": "glm-target", "model_dir": str(root / "glm"), "draft": False, "scales": files["mha"]},
        {"name": "glm-draft", "model_dir": str(root / "glm"), "draft": True, "scales": files["mha"], "record": 5.0},
        {"name": "glm-draft-uncalibrated", "model_dir": str(root / "glm"), "draft": True,
         "scales": files["mha-no-draft"]},
        {"name": "kimi-draft", "model_dir": str(root / "kimi-fp8"), "draft": True, "scales": files["mla"]},
        {"name": "kimi-draft-uncalibrated", "model_dir": str(root / "kimi-fp8"), "draft": True,
         "scales": files["mla-no-draft"]},
    ]
    (root / "cases.json").write_text(json.dumps({"amax_path": str(root / "amax"), "cases": cases}))
    r = subprocess.run([sys.executable, str(WORKER), str(root / "cases.json"), str(root / "out.json")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads((root / "out.json").read_text()), files


def test_scales_file_keeps_the_draft_layer_out_of_sglangs_part(runs):
    _, files = runs
    doc = json.loads(Path(files["mha"]).read_text())
    assert sorted(doc["kv_cache"]["scaling_factor"]["0"], key=int) == [str(i) for i in range(LAYERS)]
    assert read_draft_scales(files["mha"]) == {LAYERS: (3000.0 / 448, 60.0 / 448)}
    assert read_draft_scales(files["mha-no-draft"]) == {}


def test_sglang_numbers_the_draft_layer_zero(runs):
    out, _ = runs
    assert out["glm-draft"]["class"] == "Glm4MoeForCausalLMNextN" and out["glm-draft"]["layer_ids"] == [0]
    assert out["kimi-draft"]["class"] == "DeepseekV3ForCausalLMNextN" and out["kimi-draft"]["layer_ids"] == [0]
    assert out["glm-target"]["layer_ids"] == list(range(LAYERS))


def test_draft_layer_gets_its_own_recorded_scale_not_layer_zeros(runs):
    out, _ = runs
    assert out["glm-target"]["k_scale"] == pytest.approx([AMAX[i][0] / 448 for i in range(LAYERS)])
    assert out["glm-draft"]["k_scale"] == pytest.approx([3000.0 / 448])
    assert out["kimi-draft"]["k_scale"] == pytest.approx([3000.0 / 448])  # MLA: max(latent, rope)
    assert out["kimi-draft"]["mla_scales"][str(LAYERS)] == pytest.approx(3000.0 / 448)
    assert "0" not in out["kimi-draft"]["mla_scales"]  # the target's layer 0 scale is not the draft's


def test_uncalibrated_draft_layer_keeps_the_default_one(runs):
    out, _ = runs
    assert out["glm-draft-uncalibrated"]["k_scale"] == [None]  # never set: SGLang's 1.0
    assert out["kimi-draft-uncalibrated"]["k_scale"] == [None]


def test_recorder_files_the_draft_layer_under_its_checkpoint_layer(runs):
    out, _ = runs
    snap = out["glm-draft"]["recorded"]
    assert snap["draft_layers"] == [LAYERS] and list(snap["layers"]) == [str(LAYERS)]
    assert snap["layers"][str(LAYERS)]["k"] == 5.0 and snap["layers"][str(LAYERS)]["v"] == 2.5
