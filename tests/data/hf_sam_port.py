"""transformers' SamVisionModel (SAM's image encoder), unmodified: windowed blocks with decomposed
relative positions, the global ones at ``global_attn_indexes``, no class token, no final norm, its
position table and every block's tokens on the (gh, gw) grid (NHWC). Its neck (two convolutions,
each followed by a channels-first LayerNorm) is after the tower: ``port`` reads the tower up to its
last block, the neck's parameters out of scope with the stages after it (no option expresses the neck);
``without_tower`` does not say where the tower ends."""

import numpy as np

from conformance.capture import ModelPort, rename_function
from weights.hf.common import sizes_to_hf


def _settings(config) -> dict:
    """SamVisionConfig's names for the config's sizes and options."""
    sizes = sizes_to_hf(config)
    del sizes["intermediate_size"]  # SAM's is mlp_ratio's
    return sizes | dict(
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        use_abs_pos=config.pos_embed == "learn",
        use_rel_pos=config.use_rel_pos,
        window_size=config.window_size,
        global_attn_indexes=list(config.global_attn_indexes),
        output_channels=8,
    )


def build(config):
    from transformers import SamVisionConfig, SamVisionModel

    return SamVisionModel(SamVisionConfig(**_settings(config))).eval()


# timm's names -> transformers' SAM's (segments)
RENAME = {
    "patch_embed.proj": "vision_encoder.patch_embed.projection",
    "blocks": "vision_encoder.layers",
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "mlp.fc1": "mlp.lin1",
    "mlp.fc2": "mlp.lin2",
}


def convert(state, config):
    """The canonical state under SAM's names; its position table on the grid, (1, gh, gw, D)."""
    rename = rename_function(RENAME)
    out = {rename(k): v for k, v in state.items() if k != "pos_embed"}
    if "pos_embed" in state:
        out["vision_encoder.pos_embed"] = np.asarray(state["pos_embed"]).reshape(1, *config.grid_size, -1)
    return out


SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "class_token": False,
    "global_pool": "avg",
    "final_norm": False,
    "window_size": (0, 2, 3),
    "use_rel_pos": (True, False),
    "global_attn_indexes": lambda v: True,
    "square_images": True,  # SamVisionConfig's image_size is one side
    "square_patches": True,
}
port = ModelPort(build, convert=convert, tower="blocks.{last}", supports=SUPPORTS)
without_tower = ModelPort(build, convert=convert, supports=SUPPORTS)


def _swapped(state, config):
    """rel_pos_h and rel_pos_w of every block exchanged (a square window's tables have one shape)."""
    out = convert(state, config)
    for key in [k for k in out if k.endswith("attn.rel_pos_h")]:
        w = key[: -len("h")] + "w"
        out[key], out[w] = out[w], out[key]
    return out


rows_and_columns_swapped = ModelPort(build, convert=_swapped, tower="blocks.{last}", supports=SUPPORTS)
