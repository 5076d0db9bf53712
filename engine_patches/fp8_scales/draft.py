"""MTP / NextN draft layers (GLM-4.x's layer 92, Kimi K2's layer 61) and their FP8 KV scales.

SGLang 0.5.23 builds the draft model's one decoder layer with layer_id 0 (`Glm4MoeModelNextN`,
`DeepseekModelNextN`): it indexes the draft worker's own one-layer KV pool. Keyed by layer_id, the draft would
record its K/V maxima into the target's layer 0 and load layer 0's scale. So each draft attention module is tagged
with its checkpoint layer (config.num_hidden_layers): the recorder files its maxima under that id, the scales file
keeps them in its `capbench.draft` section (SGLang's schema admits exactly num_hidden_layers layers), and the
loader gives the draft layer that scale, or 1.0 (SGLang's default) when the calibration run had no draft model.
"""

from __future__ import annotations

LAYER_ATTR = "capbench_layer_id"
ATTENTION_NAMES = ("attn", "attn_mqa", "attn_mha")


def draft_layer_id(model) -> int | None:
    """The checkpoint layer of a NextN draft model's decoder, or None for a target model."""
    inner = getattr(model, "model", None)
    if inner is None or getattr(inner, "layers", None) is not None or not hasattr(inner, "decoder"):
        return None
    return int(model.config.num_hidden_layers)


def tag(model) -> None:
    """Mark a draft model's attention modules with their checkpoint layer (a no-op for target models)."""
    layer = draft_layer_id(model)
    if layer is None:
        return
    attention = model.model.decoder.self_attn
    for name in ATTENTION_NAMES:
        module = getattr(attention, name, None)
        if module is not None:
            setattr(module, LAYER_ATTR, layer)


def layer_id(attn, layer_id_override: int | None = None) -> int:
    """The layer a write to the KV pool belongs to, as the scales file counts layers."""
    tagged = getattr(attn, LAYER_ATTR, None)
    if tagged is not None:
        return tagged
    return layer_id_override if layer_id_override is not None else attn.layer_id


def install_tagging() -> None:
    """Tag every NextN draft model SGLang builds in this process (class-level, after its __init__)."""
    from sglang.srt.models.deepseek_nextn import DeepseekV3ForCausalLMNextN
    from sglang.srt.models.glm4_moe_nextn import Glm4MoeForCausalLMNextN

    for cls in (Glm4MoeForCausalLMNextN, DeepseekV3ForCausalLMNextN):
        if getattr(cls.__init__, "_capbench_tags", False):
            continue
        original = cls.__init__

        def __init__(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            tag(self)

        __init__._capbench_tags = True
        cls.__init__ = __init__
