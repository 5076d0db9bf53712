"""Per-layer FP8 KV scales on disk, in the JSON SGLang's `--quantization-param-path` reads.

SGLang's schema (`model_loader/weight_utils.py: QuantParamSchema`) holds ONE scale per layer and TP rank:
    {"model_type": ..., "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {tp_rank: {layer: s}}}}
and its models apply that one value to both K and V. We write that standard part with s = max(k, v), so
SGLang's own loader reads the file, and add a "capbench" section (ignored by SGLang's pydantic schema) with the
separate K and V scales and the measured maxima; our loading patch prefers the separate values.

For MLA pools (Kimi K2) "k" is the latent (kv_lora_rank part) and "v" the rope part; both live in one cached row
that the attention kernels descale with one number, so MLA layers get k_scale = v_scale = max of the two.
"""

from __future__ import annotations

import json
from pathlib import Path

E4M3_MAX = 448.0


def scale_for(amax: float, margin: float = 1.0) -> float:
    """Scale so that amax * margin lands on the e4m3 maximum; 1.0 for a layer that never saw a value."""
    if amax <= 0.0:
        return 1.0
    return amax * margin / E4M3_MAX


def merge_rank_dumps(dumps: list[dict]) -> tuple[str, dict[int, tuple[float, float]]]:
    """Per-layer (k, v) maxima over every rank's dump: per-tensor scales cover all heads of all ranks."""
    if not dumps:
        raise ValueError("no amax dumps to merge")
    layouts = {d["layout"] for d in dumps}
    if len(layouts) != 1:
        raise ValueError(f"ranks disagree on the pool layout: {sorted(layouts)}")
    merged: dict[int, tuple[float, float]] = {}
    for dump in dumps:
        for layer, m in dump["layers"].items():
            k0, v0 = merged.get(int(layer), (0.0, 0.0))
            merged[int(layer)] = (max(k0, float(m["k"])), max(v0, float(m["v"])))
    return layouts.pop(), merged


def build_scales(
    layout: str,
    amax: dict[int, tuple[float, float]],
    num_layers: int,
    tp_size: int,
    margin: float = 1.0,
    model_type: str | None = None,
) -> dict:
    """The JSON document: SGLang's standard part plus the capbench section. Layers never written get 1.0.
    Maxima of layers past num_layers (MTP draft layers, draft.py) go to the capbench section's "draft" map only:
    SGLang's schema admits exactly num_layers layers."""
    k_scale, v_scale, joint = {}, {}, {}
    drafts = {}
    for layer, (k_amax, v_amax) in sorted(amax.items()):
        if layer >= num_layers:
            k, v = scale_for(k_amax, margin), scale_for(v_amax, margin)
            if layout == "mla":
                k = v = max(k, v)
            drafts[layer] = {"k_scale": k, "v_scale": v, "amax": {"k": k_amax, "v": v_amax}}
    for layer in range(num_layers):
        k_amax, v_amax = amax.get(layer, (0.0, 0.0))
        if layout == "mla":
            s = scale_for(max(k_amax, v_amax), margin)
            k_scale[layer] = v_scale[layer] = s
        else:
            k_scale[layer] = scale_for(k_amax, margin)
            v_scale[layer] = scale_for(v_amax, margin)
        joint[layer] = max(k_scale[layer], v_scale[layer])
    per_rank = lambda m: {rank: dict(m) for rank in range(tp_size)}  # noqa: E731
    return {
        "model_type": model_type,
        "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": per_rank(joint)},
        "capbench": {
            "layout": layout,
            "margin": margin,
            "e4m3_max": E4M3_MAX,
            "k_scale": per_rank(k_scale),
            "v_scale": per_rank(v_scale),
            "amax": {layer: {"k": amax.get(layer, (0.0, 0.0))[0], "v": amax.get(layer, (0.0, 0.0))[1]}
                     for layer in range(num_layers)},
            "missing_layers": [layer for layer in range(num_layers) if layer not in amax],
            "draft": drafts,
        },
    }


def write_scales(doc: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def read_kv_scales(
    path: str | Path, tp_rank: int, tp_size: int, num_layers: int, model_type: str | None
) -> dict[int, tuple[float, float]]:
    """(k_scale, v_scale) per layer for one rank. Validates through SGLang's own loader, so a file SGLang would
    reject (wrong dtype, TP size, layer count, model type) is rejected here too, loudly: SGLang's loader only logs
    and falls back to 1.0, which is the silent failure the scales exist to prevent."""
    from sglang.srt.model_loader.weight_utils import QuantParamSchema

    doc = json.loads(Path(path).read_text())
    context = {"model_type": model_type, "num_hidden_layers": num_layers, "tp_rank": tp_rank, "tp_size": tp_size}
    schema = QuantParamSchema.model_validate(doc, context=context)
    joint = schema.kv_cache.scaling_factor[tp_rank]
    extra = doc.get("capbench") or {}
    k_map = extra.get("k_scale", {}).get(str(tp_rank), {})
    v_map = extra.get("v_scale", {}).get(str(tp_rank), {})
    out = {}
    for layer, s in joint.items():
        out[layer] = (float(k_map.get(str(layer), s)), float(v_map.get(str(layer), s)))
    return out


def read_draft_scales(path: str | Path) -> dict[int, tuple[float, float]]:
    """(k_scale, v_scale) of the MTP draft layers the calibration run saw, by checkpoint layer (all ranks alike)."""
    doc = json.loads(Path(path).read_text())
    drafts = (doc.get("capbench") or {}).get("draft") or {}
    return {int(layer): (float(d["k_scale"]), float(d["v_scale"])) for layer, d in drafts.items()}
