"""The expert formats `capbench quantize-experts --format F` writes, as SGLang 0.5.23 loads each (no torch here: the
CLI checks a format before the engine extras are imported).

- int4-g32 / int4-g128: compressed-tensors pack-quantized W4A16 (pack.py), WNA16 MoE (Marlin, Triton).
- fp8-block128: DeepSeek-style FP8 block-128 experts, the rest BF16 through Fp8Config's ignored_layers (fp8.py).
- nvfp4: compressed-tensors NVFP4 weight-only (CompressedTensorsW4A16Nvfp4MoE, FP4 Marlin). W4A4 NVFP4 needs
  activation global scales from a calibration run, which capbench does not make; published W4A4 checkpoints are
  named in data/expert_formats.yaml.
- mxfp4: refused for the catalog's architectures, with SGLang's reason (data/expert_formats.yaml why_not_loaded).

`rows_group`: the rows of an expert's intermediate dimension each MoE rank must hold whole (INT4 and FP8 scale
groups / blocks; NVFP4 Marlin's tile of 64, compressed_tensors_w4a16_nvfp4_moe.py process_weights_after_loading).
"""

from __future__ import annotations

from dataclasses import dataclass

MXFP4_REFUSAL = ("SGLang 0.5.23 does not load MXFP4 experts for DeepseekV3ForCausalLM or Glm4MoeForCausalLM: it "
                 "routes MXFP4 MoE to Mxfp4MoEMethod only for Kimi K3 (models/kimi_k3.py) and gpt-oss, and a "
                 "compressed-tensors MXFP4 checkpoint of these models stops in CompressedTensorsConfig.get_moe_scheme "
                 "with no scheme for it; use --format nvfp4 (FP4 Marlin on Hopper, Ampere and Blackwell)")


@dataclass(frozen=True)
class Scheme:
    flag: str
    catalog: str  # its data/expert_formats.yaml id
    in_group: int  # in_features must be a multiple of this
    rows_group: int
    title: str


SCHEMES = {
    "int4-g32": Scheme("int4-g32", "int4-g32", 32, 32, "INT4 W4A16 g32"),
    "int4-g128": Scheme("int4-g128", "int4-g128", 128, 128, "INT4 W4A16 g128"),
    "fp8-block128": Scheme("fp8-block128", "fp8-block128", 1, 128, "FP8 block-128"),
    "nvfp4": Scheme("nvfp4", "nvfp4-w4a16", 16, 64, "NVFP4 W4A16"),
}
FLAGS = (*SCHEMES, "mxfp4")


def scheme(flag: str) -> Scheme:
    if flag == "mxfp4":
        raise ValueError(MXFP4_REFUSAL)
    if flag not in SCHEMES:
        raise ValueError(f"--format must be one of {', '.join(FLAGS)}, got {flag!r}")
    return SCHEMES[flag]


def check_rows(s: Scheme, moe_intermediate_size: int, tp: int, ep: int) -> None:
    """ValueError (one line, with the EP that works) unless every MoE rank holds whole groups of expert rows."""
    if ep < 1 or tp % ep:
        raise ValueError(f"expert parallelism {ep} must divide tp {tp}")
    share = moe_intermediate_size // (tp // ep)
    if moe_intermediate_size % (tp // ep) == 0 and share % s.rows_group == 0:
        return
    fits = [e for e in (2, 4, 8, 16, 32, 64)
            if tp % e == 0 and (moe_intermediate_size // (tp // e)) % s.rows_group == 0]
    hint = f"; it needs --ep {fits[0]} or more" if fits and ep < fits[0] else ""
    raise ValueError(f"{s.title} needs {s.rows_group} expert rows per MoE rank at a time; tp {tp}, ep {ep} gives "
                     f"{moe_intermediate_size} / {tp // ep} = {share}{hint}")
