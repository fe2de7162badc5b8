"""mlx-vlm 0.7's Idefics3 vision tower (mlx_vlm/models/idefics3/vision.py: SmolVLM's and Idefics3's
SigLIP encoder), unmodified: MLX, NHWC images, q, k and v apart, the tanh GELU, its tokens after
``post_layernorm`` (``tower="norm"``; it has no head). As shipped, that norm is built with MLX's
default eps, 1e-5, where its blocks' take the config's ``layer_norm_eps`` (1e-6, as transformers'
``Idefics3VisionTransformer`` builds all three): a finding about mlx-vlm, located at ``norm``.
``eps_as_configured`` sets it to the config's, as transformers has it."""

from conformance.capture import ModelPort
from weights.hf.common import sizes_to_hf


def build(config):
    from mlx_vlm.models.idefics3.config import VisionConfig
    from mlx_vlm.models.idefics3.vision import VisionModel

    # as its loader reads a checkpoint's vision_config (from_dict takes the fields it knows)
    return VisionModel(VisionConfig.from_dict(sizes_to_hf(config) | {"model_type": "idefics3_vision"}))


def build_eps_as_configured(config):
    model = build(config)
    model.post_layernorm.eps = config.norm_eps
    return model


# timm's names -> mlx-vlm's (segments; transformers' Idefics3 names, as its sanitize keeps them)
RENAME = {
    "pos_embed": "embeddings.position_embedding.weight",
    "patch_embed.proj": "embeddings.patch_embedding",
    "blocks": "encoder.layers",
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.proj": "self_attn.out_proj",
    "norm": "post_layernorm",
}
SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "class_token": False,
    "global_pool": "avg",
    "fc_norm": False,  # its final norm on every token
    "qkv_fused": False,
    "act_layer": "gelu_tanh",
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, rename=RENAME, images="NHWC", tower="norm", output=lambda out: out[0], supports=SUPPORTS)
eps_as_configured = ModelPort(
    build_eps_as_configured, rename=RENAME, images="NHWC", tower="norm", output=lambda out: out[0], supports=SUPPORTS
)
