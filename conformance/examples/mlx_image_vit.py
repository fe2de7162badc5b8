"""mlx-image's VisionTransformer (``mlxim.model.vit.vit`` of mlx-image 0.1.10, kept byte for byte
in vendor/), unmodified. It takes NHWC images and keeps q, k, v as separate projections; the
convert is what its own timm conversion does."""

from functools import partial

import numpy as np

from conformance.capture import ModelPort, rename_function
from conformance.examples.torchvision_vit import encoder_sizes

RENAME = {
    "patch_embed.proj": "conv_proj",
    "cls_token": "class_token",
    "pos_embed": "encoder.pos_embedding",
    "blocks": "encoder.layers",
    "norm1": "ln_1",
    "norm2": "ln_2",
    "attn.proj": "self_attention.out_proj",
    "mlp.fc1": "mlp.linear_1",
    "mlp.fc2": "mlp.linear_2",
    "norm": "encoder.ln",
    "head": "heads.layers.0",
}


def convert(state):
    rename = rename_function(RENAME)
    out = {}
    for key, value in state.items():
        if ".attn.qkv." in key:
            for part, third in zip(("query_proj", "key_proj", "value_proj"), np.split(value, 3)):
                out[rename(key.replace("attn.qkv", f"self_attention.{part}"))] = third
        elif key == "patch_embed.proj.weight":
            out[rename(key)] = value.transpose(0, 2, 3, 1)  # OIHW -> MLX's OHWI
        else:
            out[rename(key)] = value
    return out


def build(config):
    import mlx.nn as nn
    from conformance.examples.vendor.mlxim_vit import VisionTransformer

    return VisionTransformer(
        image_size=config.img_size[0],
        patch_size=config.patch_size[0],
        num_classes=config.num_classes,
        norm_layer=partial(nn.LayerNorm, eps=config.norm_eps),
        **encoder_sizes(config),  # mlx-image's ViT is torchvision's, its arguments too
    )


# Square 3-channel images, the class token, and bias on every attention projection (attn_bias
# covers out_proj too, which timm always biases).
SUPPORTS = {"global_pool": "token", "in_chans": 3, "qkv_bias": True, "square_images": True, "square_patches": True}
port = ModelPort(build, convert=convert, images="NHWC", supports=SUPPORTS)
