"""Equimo's ``VisionTransformer`` (an Equinox model zoo: timm's ViT, DINOv2 and DINOv3 in
Equinox), unmodified. Its modules act on one image (C, H, W), as Equinox's do: the adapter calls
it under ``jax.vmap`` over the batch. Its blocks sit in chunks (``blocks.0.blocks.{i}``), its
norms are ``prenorm`` and ``norm``, and its "gelu" is ``jax.nn.gelu``, whose default is the tanh
approximation: timm's exact GELU is its ``"exactgelu"`` (``gelu_tanh_port`` keeps the default)."""

import re

from conformance.capture import ModelPort

NAMES = [
    (r"^blocks\.(\d+)\.norm1\.", r"blocks.0.blocks.\1.prenorm."),
    (r"^blocks\.(\d+)\.norm2\.", r"blocks.0.blocks.\1.norm."),
    (r"^blocks\.(\d+)\.", r"blocks.0.blocks.\1."),
    (r"^pos_embed$", "global_pos_embed.weight"),
]


def rename(key: str) -> str:
    for pattern, repl in NAMES:
        new = re.sub(pattern, repl, key)
        if new != key:
            return new
    return key


def build(config, act_layer=None):
    import jax.random as jr
    from equimo.models import VisionTransformer

    return VisionTransformer(
        img_size=config.img_size[0],
        in_channels=config.in_chans,
        dim=config.embed_dim,
        patch_size=config.patch_size[0],
        num_heads=config.num_heads,
        depths=[config.depth],
        mlp_ratio=config.mlp_ratio,
        num_classes=config.num_classes,
        global_pool=config.global_pool,
        reg_tokens=0,
        eps=config.norm_eps,
        act_layer=act_layer or {"gelu": "exactgelu", "gelu_tanh": "gelu"}[config.act_layer],
        key=jr.PRNGKey(0),
    )


# Square images and patches, the class token, timm's block without LayerScale
SUPPORTS = {
    "global_pool": "token",
    "qkv_bias": True,
    "square_images": True,
    "square_patches": True,
    "act_layer": ("gelu", "gelu_tanh"),
}
port = ModelPort(build, rename=rename, images="NCHW", call_kwargs={"inference": True}, supports=SUPPORTS)
# Equimo's default activation for a model that means timm's exact GELU: the tanh approximation
gelu_tanh_port = ModelPort(
    lambda config: build(config, act_layer="gelu"), rename=rename, call_kwargs={"inference": True}, supports=SUPPORTS
)
