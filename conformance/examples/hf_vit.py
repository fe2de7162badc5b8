"""transformers' ViTForImageClassification and ViTModel, unmodified, built from the HF config
of the canonical one. transformers keeps q, k and v as separate projections, so the mapping is a
convert that renames and splits timm's fused qkv, as conversion scripts do."""

import numpy as np

from conformance.capture import ModelPort, rename_function
from weights import hf
from weights.hf import vit_config_to_hf

RENAME = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj": "embeddings.patch_embeddings.projection",
    "blocks": "layers",
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "attn.proj": "attention.o_proj",
    "norm": "layernorm",
    "head": "classifier",
}


def convert(state, prefix="vit.", head=True):
    rename = rename_function(RENAME)
    out = {}
    for key, value in state.items():
        if key.startswith("head."):
            if head:
                out[rename(key)] = value
            continue
        if ".attn.qkv." in key:
            for part, third in zip(("q_proj", "k_proj", "v_proj"), np.split(value, 3)):
                out[prefix + rename(key.replace("attn.qkv", f"attention.{part}"))] = third
        else:
            out[prefix + rename(key)] = value
    return out


def build(config):
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(**vit_config_to_hf(config))).eval()


def build_model(config):
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(**vit_config_to_hf(config)), add_pooling_layer=False).eval()


# transformers' ViT pools the class token and has no avg pooling.
SUPPORTS = {"global_pool": "token", "square_images": True, "square_patches": True}
port = ModelPort(build, convert=convert, output=lambda out: out.logits, supports=SUPPORTS)
# ViTModel has no classifier: the mapping drops head, so pooled and logits are unseen.
model_port = ModelPort(
    build_model,
    convert=lambda state: convert(state, prefix="", head=False),
    output=lambda out: out.last_hidden_state,
    supports=SUPPORTS,
)


def _family(model_type: str, classes: tuple[str, str], supports: dict) -> ModelPort:
    """transformers' CLIP or SigLIP vision tower, unmodified, headless: built from the Hugging Face
    config of the canonical one, loaded through this project's exporter (weights.hf), its
    pooler_output the output; ``supports``: what the family adds to what both towers hold."""
    import importlib

    def build(config):
        transformers = importlib.import_module("transformers")
        settings = {
            k: v
            for k, v in hf.family_config_to_hf(config, model_type).items()
            if k not in ("model_type", "architectures")
        }
        return getattr(transformers, classes[1])(getattr(transformers, classes[0])(**settings)).eval()

    def convert(state, config):  # the tower's own state dict has no "vision_model." prefix
        return {k.removeprefix("vision_model."): v for k, v in hf.to_family_hf(state, config, model_type).items()}

    both = {"qkv_bias": True, "num_classes": 0, "square_images": True, "square_patches": True}  # qkv: the layout's
    return ModelPort(build, convert=convert, output=lambda out: out.pooler_output, supports=both | supports)


# CLIPVisionModel applies post_layernorm to the class token alone (a (B, D) norm: compared on
# that token) and returns it as pooler_output; SiglipVisionModel's MAP head is an
# nn.MultiheadAttention (so capture runs two passes) and its pooler_output is the pooled feature.
clip_port = _family(
    "clip_vision_model",
    ("CLIPVisionConfig", "CLIPVisionModel"),
    {"pre_norm": True, "global_pool": "token", "act_layer": ("quick_gelu", "gelu"), "norm_eps": 1e-5},
)
siglip_port = _family(
    "siglip_vision_model",
    ("SiglipVisionConfig", "SiglipVisionModel"),
    {"global_pool": "map", "class_token": False, "act_layer": "gelu_tanh"},
)


def deit_convert(state):
    """DeiT's distilled model: the ViT's names under ``deit.``, the distillation token beside the
    class token, cls_classifier and distillation_classifier for head and head_dist."""
    vit = {k: v for k, v in state.items() if not k.startswith(("dist_token", "head"))}
    out = convert(vit, prefix="deit.", head=False)
    out["deit.embeddings.distillation_token"] = state["dist_token"]
    for ours, theirs in (("head", "cls_classifier"), ("head_dist", "distillation_classifier")):
        for leaf in ("weight", "bias"):
            out[f"{theirs}.{leaf}"] = state[f"{ours}.{leaf}"]
    return out


def build_deit(config):
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    settings = vit_config_to_hf(config)
    settings.pop("architectures"), settings.pop("model_type")
    return DeiTForImageClassificationWithTeacher(DeiTConfig(**settings)).eval()


# DeiTForImageClassificationWithTeacher: the logits are the mean of its two classifiers'.
deit_port = ModelPort(
    build_deit,
    convert=deit_convert,
    output=lambda out: out.logits,
    supports={**SUPPORTS, "distilled": True},
)
