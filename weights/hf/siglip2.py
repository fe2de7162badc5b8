"""transformers' SigLIP 2 vision tower (``Siglip2VisionModel``, model_type ``siglip2_vision_model``,
or a whole ``siglip2`` checkpoint's ``vision_model``): config.json to and from a ``ViTConfig``, the
state to and from canonical.

The model is SigLIP's (``siglip_vision_model``, weights/hf/family.py: q, k and v projected
apart, ``post_layernorm`` the final norm, the MAP head ``head.*`` timm's ``attn_pool``) on NaFlex's
inputs: the patch embedding a Linear over each patch flattened (ph, pw, C)
(``Siglip2ImageProcessor``'s layout, timm's ``batch_patchify``), read as the canonical (D, C, ph,
pw) kernel; ``position_embedding`` one square table of ``num_patches`` entries
(``pos_embed_grid_size``), resized to each image's ``spatial_shapes`` bilinearly with antialias
(``pos_embed_interp_mode='bilinear'``), covering the patches alone. Every mapping is a rename, a
split, a concatenation or a transpose: bitwise both ways.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.hf.common import ACT_BACK, act_of, refuse
from weights.hf.family import to_clip_family, from_family_hf, vision_fields
from weights.options import holds

MODEL_TYPE = "siglip2_vision_model"
HOLDS = holds(f"hf:{MODEL_TYPE}")  # weights/options.py
_PATCH = "embeddings.patch_embedding.weight"


def siglip2_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a Siglip2VisionConfig's config.json (a whole ``siglip2`` one's ``vision_config``)."""
    v = vision_fields(hf)
    if not v.flag("vision_use_head", True):
        raise WeightError("vision_use_head=False: a SigLIP 2 tower without its MAP head has no timm pooling")
    D, p, n = v.integer("hidden_size"), v.integer("patch_size", 16), v.integer("num_patches", 256)
    side = math.isqrt(n)
    if side * side != n:
        raise WeightError(f"num_patches {n} is not a square: SigLIP 2's table is side x side")
    return ViTConfig(
        img_size=side * p,
        patch_size=p,
        in_chans=v.integer("num_channels", 3),
        num_classes=0,
        global_pool="map",
        class_token=False,
        embed_dim=D,
        depth=v.depth(),
        num_heads=v.integer("num_attention_heads"),
        mlp_ratio=v.mlp_ratio("intermediate_size", D, 4 * D),
        norm_eps=v.number("layer_norm_eps", 1e-6),
        act_layer=act_of(v, "gelu_pytorch_tanh"),
        no_embed_class=True,
        dynamic_img_size=True,
        pos_embed_grid_size=side,
        pos_embed_interp_mode="bilinear",
    )


def vit_config_to_siglip2(config: ViTConfig) -> dict:
    """A Siglip2VisionModel's config.json for ``config``, or a WeightError naming what it cannot hold."""
    (gh, gw), (ph, pw) = config.pos_grid, config.patch_size
    extra = [] if gh == gw else [f"a {gh}x{gw} table (SigLIP 2's is square)"]
    extra += [] if ph == pw else [f"patch_size {config.patch_size} (SigLIP 2's is square)"]
    refuse(config, MODEL_TYPE, HOLDS, extra)
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["Siglip2VisionModel"],
        "hidden_size": config.embed_dim,
        "intermediate_size": config.mlp_hidden_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "num_channels": config.in_chans,
        "patch_size": ph,
        "num_patches": gh * gw,
        "hidden_act": ACT_BACK[config.act_layer],
        "layer_norm_eps": config.norm_eps,
        "vision_use_head": True,
    }


def to_siglip2(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    vit_config_to_siglip2(config)  # refuses what the layout cannot hold
    out = {k: np.ascontiguousarray(v) for k, v in to_clip_family(state, config, "siglip_vision_model").items()}
    w = out[_PATCH]  # (D, C, ph, pw) -> (D, ph pw C)
    out[_PATCH] = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1))
    return out


def from_siglip2(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    s = {k.removeprefix("vision_model."): v for k, v in state.items() if not k.startswith("text_model.")}
    (ph, pw), C = config.patch_size, config.in_chans
    w = s.get(_PATCH)
    if w is None or w.ndim != 2 or w.shape[1] != ph * pw * C:
        got = None if w is None else tuple(w.shape)
        raise WeightError(f"{_PATCH} has shape {got}: expected (hidden_size, {ph * pw * C}), (ph, pw, C) flattened")
    s[_PATCH] = np.ascontiguousarray(w.reshape(w.shape[0], ph, pw, C).transpose(0, 3, 1, 2))
    return from_family_hf(s, config, "siglip_vision_model")
