"""Which INT4 group sizes a deployment can load, and what a converted checkpoint needs at launch. No torch here:
`capbench sglang-launch` reads it before SGLang starts.

SGLang's FusedMoE splits each expert's intermediate dimension over the MoE tensor-parallel ranks
(moe_tp = tp / ep). The down projection's input columns are that dimension, and its INT4 groups run along it, so
each rank's share must hold whole groups: (moe_intermediate_size / moe_tp) % group_size == 0. The WNA16 scheme
sizes its per-rank scale tensor as share // group_size (`compressed_tensors_wNa16_moe.py: create_weights`), so a
share of 192 rows (GLM-4.6 at tp 8) with g128 gets one group where the checkpoint has one and a half: the load is
wrong. The gate/up projections group along hidden_size, which is never split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GROUP_SIZES = (32, 128)  # what SGLang's WNA16 MoE kernels are built for (Marlin and Triton)

# SGLang 0.5.23 fuses GLM's shared expert into the routed-expert slots by default on NVIDIA (sm80+) without
# expert parallelism (glm4_moe.py: shared_experts_fusion_disable_reason). With W4A16 experts the fused slot is a
# packed INT4 slot, but the shared expert stays BF16 in the checkpoint: its `...weight` tensors match no W4A16
# parameter, the loader skips them, and the slot stays uninitialised. DeepseekV2 (Kimi) opts out for W4A16 itself.
UNFUSED_SHARED_EXPERT_ARCHS = ("Glm4MoeForCausalLM",)
FUSION_OFF = "--disable-shared-experts-fusion"


@dataclass(frozen=True)
class Int4Checkpoint:
    """A local checkpoint with quantised routed experts and BF16 shared experts (INT4 W4A16, or capbench's FP8
    block-128 / NVFP4 experts: fmt is the `quantize-experts --format` flag; group_size its scale group)."""

    architecture: str
    group_size: int
    moe_intermediate_size: int
    hidden_size: int
    fmt: str = "int4"


def moe_tp_size(tp: int, ep: int) -> int:
    if tp < 1 or ep < 1 or tp % ep:
        raise ValueError(f"expert parallelism {ep} must divide tp {tp}")
    return tp // ep


def working_group_sizes(moe_intermediate_size: int, hidden_size: int, tp: int, ep: int) -> list[int]:
    share = moe_intermediate_size // moe_tp_size(tp, ep)
    return [g for g in GROUP_SIZES if share % g == 0 and hidden_size % g == 0 and moe_intermediate_size % g == 0]


def check_group_size(group_size: int, moe_intermediate_size: int, hidden_size: int, tp: int, ep: int = 1) -> None:
    """ValueError (one line, saying what works) unless every rank holds whole INT4 groups."""
    moe_tp = moe_tp_size(tp, ep)
    if moe_intermediate_size % moe_tp:
        raise ValueError(f"moe_intermediate_size {moe_intermediate_size} does not split over {moe_tp} MoE ranks")
    share = moe_intermediate_size // moe_tp
    if group_size in working_group_sizes(moe_intermediate_size, hidden_size, tp, ep):
        return
    works = working_group_sizes(moe_intermediate_size, hidden_size, tp, ep)
    where = f"tp {tp}" + (f", ep {ep}" if ep > 1 else "")
    hint = (f"group sizes that work at {where}: {', '.join(map(str, works))}" if works
            else f"no group size works at {where}")
    fits = [ep2 for ep2 in (2, 4, 8, 16) if tp % ep2 == 0 and (moe_intermediate_size // (tp // ep2)) % group_size == 0]
    if fits and ep not in fits:
        hint += f"; g{group_size} needs --ep {fits[0]} or more"
    raise ValueError(f"INT4 group size {group_size} does not divide the per-rank expert intermediate size {share} "
                     f"(moe_intermediate_size {moe_intermediate_size} / {moe_tp} MoE ranks at {where}); {hint}")


def read_int4_checkpoint(model_path: str | Path) -> Int4Checkpoint | None:
    """The facts of a local checkpoint with quantised experts (compressed-tensors W4A16 INT4 or NVFP4, or FP8 block
    experts with BF16 shared experts), or None (a hub id, or none of those)."""
    config_file = Path(model_path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    qc = config.get("quantization_config") or {}
    text = config.get("text_config") or config
    facts = ((config.get("architectures") or [""])[0], int(text.get("moe_intermediate_size", 0)),
             int(text.get("hidden_size", 0)))
    if qc.get("quant_method") == "fp8" and "shared_experts" in (qc.get("ignored_layers") or []):
        return Int4Checkpoint(facts[0], 128, facts[1], facts[2], "fp8-block128")  # capbench's FP8 experts
    if qc.get("quant_method") != "compressed-tensors":
        return None
    for group in (qc.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if w.get("num_bits") == 4 and w.get("type") == "int" and w.get("strategy") == "group":
            return Int4Checkpoint(facts[0], int(w["group_size"]), facts[1], facts[2])
        if w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == 16 and \
                group.get("input_activations") is None:
            return Int4Checkpoint(facts[0], 16, facts[1], facts[2], "nvfp4")  # weight-only NVFP4
    return None
