"""transformers' Llama4VisionModel (Llama 4's vision tower), unmodified, as Llama 4 reads it, up to
its final norm (``layernorm_post``; the pixel shuffle and the MLP adapter after it out of scope). Its
patch embedding a Linear over each patch unfolded (c p1 p2); its class token appended after the
patches, the position table's class row last too (``prefix="last"``); a LayerNorm before the blocks;
its rotation applied as complex numbers (freqs_ci, a complex buffer) to neighbouring pairs, the first
half of them by the column, the second by the row, both counted from 1, the class token's unturned:
timm's 'cat' bands, x first, offset 1. ``prefix_unsaid`` does not say where the class token is."""

from dataclasses import replace

from conformance.capture import ModelPort
from impls.protocol import Unsupported
from weights.hf.common import sizes_to_hf


def even_grid(config) -> None:
    """Llama 4's pixel shuffle halves each side of the grid, on every call: an odd side is no input of it."""
    if any(g % 2 for g in config.grid_size):
        raise Unsupported(f"Llama 4's pixel shuffle halves each side of the grid: grid {config.grid_size} must be even")


def settings(config) -> dict:
    """Llama4VisionConfig's settings for ``config``: its sizes in config.json's names (its norms' eps
    as ``norm_eps``), its adapter as wide as the tower, its pixel shuffle halving each side."""
    even_grid(config)
    sizes, width = sizes_to_hf(config), config.embed_dim
    eps = sizes.pop("layer_norm_eps")
    adapter = dict(vision_output_dim=width, projector_input_dim=width, projector_output_dim=width)
    return sizes | adapter | dict(norm_eps=eps, pixel_shuffle_ratio=0.5)


def build(config):
    from transformers import Llama4VisionConfig, Llama4VisionModel

    rope = {"rope_type": "default", "rope_theta": config.rope_temperature}
    return Llama4VisionModel(Llama4VisionConfig(**settings(config), rope_parameters=rope)).eval()


# timm's names -> transformers' Llama 4's (segments)
RENAME = {
    "cls_token": "class_embedding",
    "pos_embed": "positional_embedding_vlm",
    "patch_embed.proj": "patch_embedding.linear",
    "norm_pre": "layernorm_pre",
    "blocks": "model.layers",
    "norm1": "input_layernorm",
    "norm2": "post_attention_layernorm",
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.proj": "self_attn.o_proj",
    "norm": "layernorm_post",
}
SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "global_pool": "avg",
    "fc_norm": False,  # its final norm on every token
    "class_token": True,
    "pre_norm": True,
    "patch_bias": False,
    "qkv_fused": False,
    "rope_type": "cat",
    "rope_grid_indexing": "xy",
    "rope_grid_offset": 1.0,
    "mlp_ratio": 4.0,  # the adapter's pixel shuffle reads 4 x the width: its MLP's input is the blocks' hidden width
    "norm_eps": 1e-5,  # nn.LayerNorm's default in each of its norms, whatever its config's norm_eps
    "qkv_bias": True,
    "proj_bias": True,
    "act_layer": "gelu",  # nn.GELU() whatever its config's hidden_act
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, rename=RENAME, patch_order="c p1 p2", tower="norm", prefix="last", supports=SUPPORTS)
prefix_unsaid = replace(port, prefix="first")
