"""`capbench quantize-experts` round trips on tiny GLM (BF16) and Kimi (FP8 block-128, and INT4 made from it, as Kimi
K2 Thinking ships) checkpoints: every routed expert read back through compressed-tensors' own decoders (NVFP4:
unpack_fp4_from_uint8; INT4: the pack-quantized decompressor) or the FP8 block arithmetic SGLang uses, and its error
measured against the BF16 reference the tiny checkpoint was made from; the rest of the model untouched.
Run with -s to print the table."""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from safetensors import safe_open

from engine_patches.int4_moe.convert import EXPERT_WEIGHT
from engine_patches.int4_moe.pack_float import dequant_int4, quantize_nvfp4
from tests.engine_patches.int4_checkpoints import cached_checkpoint, make_checkpoint

ROWS = 1024  # 128 expert rows per rank at tp 8
CHAINS = {  # name: (input kind, formats in turn)
    "glm bf16 -> int4-g32": ("glm", ["int4-g32"]),
    "glm bf16 -> fp8-block128": ("glm", ["fp8-block128"]),
    "glm bf16 -> nvfp4": ("glm", ["nvfp4"]),
    "kimi fp8 -> int4-g32": ("kimi-fp8", ["int4-g32"]),
    "kimi fp8 -> fp8-block128": ("kimi-fp8", ["fp8-block128"]),
    "kimi fp8 -> nvfp4": ("kimi-fp8", ["nvfp4"]),
    "kimi fp8 -> int4-g32 -> fp8-block128": ("kimi-fp8", ["int4-g32", "fp8-block128"]),
    "kimi fp8 -> int4-g32 -> nvfp4": ("kimi-fp8", ["int4-g32", "nvfp4"]),
}
RESULTS: dict[str, dict] = {}


def load_all(out_dir) -> dict[str, torch.Tensor]:
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(out_dir / shard, "pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    return tensors


def decoded(tensors: dict, module: str) -> torch.Tensor:
    """An expert projection's stored values, decoded as its format's readers decode it."""
    if module + ".weight_global_scale" in tensors:  # NVFP4: compressed-tensors' own unpacker
        packed, scale = tensors[module + ".weight_packed"], tensors[module + ".weight_scale"]
        rows, cols = packed.shape[0], packed.shape[1] * 2
        values = unpack_fp4_from_uint8(packed, rows, cols, dtype=torch.float32)
        return values * (scale.float() / tensors[module + ".weight_global_scale"].float()).repeat_interleave(16, 1)
    if module + ".weight_packed" in tensors:
        return dequant_int4(tensors[module + ".weight_packed"], tensors[module + ".weight_scale"],
                            tensors[module + ".weight_shape"])
    w, s = tensors[module + ".weight"], tensors[module + ".weight_scale_inv"]
    full = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
    return w.float() * full


@pytest.fixture(scope="module")
def trips(tmp_path_factory):
    root = tmp_path_factory.mktemp("trips")
    bf16 = {kind: make_checkpoint(root / kind, kind, moe_inter=ROWS) for kind in ("glm", "kimi-fp8")}
    out = {}
    for name, (kind, chain) in CHAINS.items():
        steps = [cached_checkpoint(kind, tuple(chain[:i]), moe_inter=ROWS) for i in range(1, len(chain) + 1)]
        out[name] = (bf16[kind], load_all(steps[-1]), [json.loads((s / "int4_report.json").read_text()) for s in steps])
    return out


@pytest.mark.parametrize("name", list(CHAINS))
def test_round_trip_error_against_the_bf16_reference(trips, name):
    reference, tensors, reports = trips[name]
    err = norm = 0.0
    for key, ref in reference.items():
        m = EXPERT_WEIGHT.match(key)
        if m:
            got = decoded(tensors, m["module"])
            err += float((got - ref.float()).square().sum())
            norm += float(ref.float().square().sum())
        elif not key.endswith("_scale_inv"):  # the rest: as shipped, FP8 inputs' non-experts dequantised to BF16
            # within BF16's rounding of each value (2^-8 of it; 2^-7 for the two roundings FP8 -> float -> BF16)
            assert torch.allclose(tensors[key].float(), ref.float(), rtol=2**-7, atol=1e-6 + 2e-3 * ref.abs().max())
    rel = (err / norm) ** 0.5
    RESULTS[name] = {"vs_bf16": rel, "last_step_vs_its_input": reports[-1]["overall_rel_err"]}
    fmt = CHAINS[name][1][-1]
    bound = {"fp8-block128": 0.04, "int4-g32": 0.12, "nvfp4": 0.12}[fmt]
    if len(CHAINS[name][1]) > 1:  # through INT4: INT4's error and the new rounding of the INT4 grid add up
        bound = (0.12**2 + bound**2) ** 0.5
    assert rel < bound
    if len(RESULTS) == len(CHAINS):
        print("\nrelative error of the routed experts against the BF16 reference (Gaussian weights, 1024 rows):")
        for n, r in RESULTS.items():
            print(f"  {n:40s} {r['vs_bf16']:.4f}  (last step against its own input: {r['last_step_vs_its_input']:.4f})")


def test_fp8_block_from_fp8_block_is_exact(trips):
    _, _, reports = trips["kimi fp8 -> fp8-block128"]
    assert reports[0]["overall_rel_err"] == 0.0 and reports[0]["source_format"] == "fp8-block128"


def test_nvfp4_gate_and_up_share_one_global_scale(trips):
    _, tensors, _ = trips["glm bf16 -> nvfp4"]
    for e in range(8):
        p = f"model.layers.1.mlp.experts.{e}."
        assert torch.equal(tensors[p + "gate_proj.weight_global_scale"], tensors[p + "up_proj.weight_global_scale"])


def test_nvfp4_codes_are_compressed_tensors_nearest_values():
    """Every E2M1 code is the nearest value, ties broken as compressed-tensors' cast_to_fp4 breaks them (a group whose
    max is 6 has step 1: global scale 448 * 6 / 6, group scale 448 in e4m3, exact)."""
    w = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, -5.0]])
    stored, _, _ = quantize_nvfp4(w)
    assert float(stored["weight_global_scale"]) == 448.0 and float(stored["weight_scale"].float()) == 448.0
    got = unpack_fp4_from_uint8(stored["weight_packed"], 1, 16, dtype=torch.float32)
    assert got.tolist() == [[0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.5, 2.0, 2.0, 2.0, 3.0, 4.0, 4.0, 4.0, 6.0, -4.0]]
