"""transformers' ViTForImageClassification and ViTModel, unmodified, built from the HF config
of the canonical one. transformers keeps q, k and v as separate projections, so the mapping is a
convert that renames and splits timm's fused qkv, as conversion scripts do."""

import numpy as np

from conformance.capture import ModelPort, rename_function
from weights.hf import vit_config_to_hf

RENAME = {"cls_token": "embeddings.cls_token", "pos_embed": "embeddings.position_embeddings",
          "patch_embed.proj": "embeddings.patch_embeddings.projection", "blocks": "layers",
          "norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.o_proj",
          "norm": "layernorm", "head": "classifier"}


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
model_port = ModelPort(build_model, convert=lambda state: convert(state, prefix="", head=False),
                       output=lambda out: out.last_hidden_state, supports=SUPPORTS)
