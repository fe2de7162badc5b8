"""mlx-vlm 0.7's InternViT tower (mlx_vlm/models/internvl_chat/vision.py: InternVL's vision model),
unmodified: MLX, NHWC images, one fused qkv, LayerScale as bare ``ls1`` and ``ls2``, no final norm (the
tower ends at its last block), called as its VLM calls it (``output_hidden_states=True``: without it the
model raises on its own return) and in eval mode, as mlx-vlm's loader leaves it (its drop path is an
nn.Dropout). As shipped its MLPs take ``nn.GELU(approx="precise")``, MLX's tanh approximation, where
InternViT's config says ``hidden_act="gelu"``, the exact GELU (transformers' ``InternVLVisionModel``,
OpenGVLab's own): a finding about mlx-vlm, located at ``blocks.0.mlp.act``. ``gelu_as_configured``
sets the exact GELU in each block."""

from conformance.capture import ModelPort
from weights.hf.common import sizes_to_hf


def build(config):
    from mlx_vlm.models.internvl_chat.config import VisionConfig
    from mlx_vlm.models.internvl_chat.vision import VisionModel

    # as its loader reads a checkpoint's vision_config (from_dict takes the fields it knows)
    settings = {**sizes_to_hf(config), "model_type": "intern_vit_6b", "qkv_bias": config.qkv_bias}
    model = VisionModel(VisionConfig.from_dict(settings))
    model.eval()  # as mlx_vlm.utils.load_model leaves it
    return model


def build_gelu_as_configured(config):
    import mlx.nn as nn

    model = build(config)
    for layer in model.encoder.layers:
        layer.mlp.activation_fn = nn.GELU()
    return model


# timm's names -> mlx-vlm's (segments; InternViT's own, as its sanitize keeps them)
RENAME = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj": "embeddings.patch_embedding",
    "blocks": "encoder.layers",
    "ls1.gamma": "ls1",
    "ls2.gamma": "ls2",
}
SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "final_norm": False,
    "init_values": lambda v: v is not None,
    "class_token": True,
    "global_pool": "token",
    "in_chans": 3,  # its patch convolution takes 3 channels whatever its config says
    "square_images": True,
    "square_patches": True,
}
CALL = {"output_hidden_states": True}


def _port(build):
    return ModelPort(
        build, rename=RENAME, images="NHWC", tower="blocks.{last}", output=lambda out: out[0], call_kwargs=CALL,
        supports=SUPPORTS,
    )  # fmt: skip


port, gelu_as_configured = _port(build), _port(build_gelu_as_configured)
