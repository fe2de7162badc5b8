"""transformers' DINOv3 ViT (``DINOv3ViTModel``, model_type ``dinov3_vit``): config.json to and
from a ``ViTConfig``, the state to and from canonical.

The model is timm's Eva as DINOv3 uses it: q, k and v projected apart (``qkv_fused=False``) with
their own biases (``query_bias``, ``key_bias``, ``value_bias``: q's and v's must agree, the
canonical form has one ``qkv_bias``), LayerScale ``lambda1``, no position table but DINOv3's
rotation (``rope_type='dinov3'``, base ``rope_theta``, halves rotated), register tokens, a plain
or gated MLP (``use_gated_mlp``: ``gate_proj`` is timm's ``fc1_g``, ``up_proj`` its ``fc1_x``),
and the pooler output, the class token after the final norm (``global_pool='token'``, no head).
``mask_token`` is used only with ``bool_masked_pos`` (masked-image training): it is dropped on
import and written as zeros; ``pos_embed_shift``, ``_jitter`` and ``_rescale`` act only in
training. Every tensor is renamed, never changed, so each direction is bitwise.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, block_shapes, expected_shapes
from weights.config import ViTConfig
from weights.hf.fields import Fields
from weights.hf.common import act_of, refuse, sizes_from_hf, sizes_to_hf
from weights.options import holds

MODEL_TYPE = "dinov3_vit"
HOLDS = holds(f"hf:{MODEL_TYPE}")  # weights/options.py


def dinov3_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a DINOv3ViTConfig's config.json; every setting taken, none assumed."""
    f = Fields(hf)
    q, k, v = (f.flag(f"{p}_bias", d) for p, d in (("query", True), ("key", False), ("value", True)))
    if q != v or (k and not q):
        raise WeightError(
            f"query_bias={q}, key_bias={k}, value_bias={v}: the canonical form has one qkv_bias for q and v "
            "(and k_bias for k beside them); not representable"
        )
    proj, mlp = f.flag("proj_bias", True), f.flag("mlp_bias", True)
    return ViTConfig(
        **sizes_from_hf(f),
        qkv_bias=q,
        k_bias=k if q else True,
        qkv_fused=False,
        proj_bias=proj,
        mlp_bias=None if mlp == proj else mlp,
        mlp_layer="swiglu" if f.flag("use_gated_mlp", False) else "mlp",
        act_layer=act_of(f),
        norm_eps=f.number("layer_norm_eps", 1e-5),
        init_values=float(f.number("layerscale_value", 1.0)),
        reg_tokens=f.integer("num_register_tokens", 0, minimum=0),
        pos_embed="none",
        dynamic_img_size=True,  # the rotation is computed at each image's grid
        rope_type="dinov3",
        rope_temperature=float(f.number("rope_theta", 100.0)),
        rope_rotate_half=True,
    )


def vit_config_to_dinov3(config: ViTConfig) -> dict:
    refuse(
        config,
        MODEL_TYPE,
        HOLDS,
        ["init_values=None (DINOv3 always has LayerScale)"] if config.init_values is None else [],
    )
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["DINOv3ViTModel"],
        **sizes_to_hf(config),
        "rope_theta": config.rope_temperature,
        "query_bias": config.qkv_bias,
        "key_bias": config.qkv_bias and config.k_bias,
        "value_bias": config.qkv_bias,
        "proj_bias": config.proj_bias,
        "mlp_bias": config.use_mlp_bias,
        "layerscale_value": config.init_values,
        "use_gated_mlp": config.mlp_layer == "swiglu",
        "num_register_tokens": config.reg_tokens,
    }


# Canonical names -> DINOv3ViTModel's: outside the blocks, and within a block (``blocks.{i}``,
# theirs ``layer.{i}``) by module, a LayerScale parameter by its whole name
OUTSIDE = {
    "cls_token": "embeddings.cls_token",
    "reg_token": "embeddings.register_tokens",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.bias",
    "norm.weight": "norm.weight",
    "norm.bias": "norm.bias",
}
BLOCK = {
    "norm1": "norm1",
    "norm2": "norm2",
    "ls1.gamma": "layer_scale1.lambda1",
    "ls2.gamma": "layer_scale2.lambda1",
    **{f"attn.{p}_proj": f"attention.{p}_proj" for p in "qkv"},
    "attn.proj": "attention.o_proj",
    "mlp.fc1_g": "mlp.gate_proj",
    "mlp.fc1_x": "mlp.up_proj",
    "mlp.fc1": "mlp.up_proj",
    "mlp.fc2": "mlp.down_proj",
}


def _in_block(key: str) -> str | None:
    """A block's canonical key (relative to it) as DINOv3ViTModel names it, or None."""
    if key in BLOCK:
        return BLOCK[key]
    module, _, param = key.rpartition(".")
    return f"{BLOCK[module]}.{param}" if module in BLOCK else None


def names(config: ViTConfig) -> dict[str, str]:
    """Canonical key -> DINOv3ViTModel's checkpoint name (``layer.{i}``: the module is
    ``model.layer.{i}`` in memory, and transformers renames on loading), for every key the config
    has that the layout holds, in timm's order."""
    out = dict(OUTSIDE)
    block = {key: theirs for key in block_shapes(config) if (theirs := _in_block(key)) is not None}
    for i in range(config.depth):
        out.update({f"blocks.{i}.{key}": f"layer.{i}.{theirs}" for key, theirs in block.items()})
    return {k: out[k] for k in expected_shapes(config) if k in out}


# what an image's forward never reads: masked-image training's token, and the register tokens of a
# model without any (transformers saves a (1, 0, D) tensor)
UNREAD = ("embeddings.mask_token", "embeddings.register_tokens")


def from_dinov3(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """A DINOv3ViTModel checkpoint (its names as saved, or as in memory: ``model.layer.{i}``) -> canonical."""
    state = {k.removeprefix("model.") if k.startswith("model.layer.") else k: v for k, v in state.items()}
    mapping = names(config)
    missing = [k for k in expected_shapes(config) if k not in mapping]
    if missing:
        raise WeightError(f"the Hugging Face {MODEL_TYPE} layout has no place for {missing} of {config}")
    absent = [theirs for theirs in mapping.values() if theirs not in state]
    if absent:
        raise WeightError(f"Hugging Face {MODEL_TYPE} checkpoint is missing keys {absent[:4]} for {config}")
    known = set(mapping.values()) | set(UNREAD)
    unknown = sorted(k for k in state if k not in known)
    if unknown:
        raise WeightError(f"Hugging Face {MODEL_TYPE} checkpoint has keys {unknown[:4]} that {config} has no place for")
    return {ours: np.ascontiguousarray(state[theirs]) for ours, theirs in mapping.items()}


def to_dinov3(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    vit_config_to_dinov3(config)  # refuses what the layout cannot hold
    out = {theirs: np.ascontiguousarray(state[ours]) for ours, theirs in names(config).items()}
    out["embeddings.mask_token"] = np.zeros((1, 1, config.embed_dim), np.float32)
    out.setdefault("embeddings.register_tokens", np.zeros((1, 0, config.embed_dim), np.float32))
    return out
