"""transformers' vision towers of today's VLMs (issue 60): AIMv2's (``Aimv2VisionModel``, model_type
``aimv2_vision_model``), InternViT's (``InternVLVisionModel``, ``internvl_vision``) and Pixtral's
(``PixtralVisionModel``, ``pixtral``): config.json to and from a ``ViTConfig``, the state to and
from canonical.

* AIMv2: RMSNorm everywhere (the patch embedding's ``embeddings.rms_norm`` is timm's
  ``patch_embed.norm``), no class token, a (N, D) position table, q, k and v projected apart,
  SwiGLU (``ffn.gate_proj`` is timm's ``fc1_g``, ``up_proj`` its ``fc1_x``), the tokens' mean after
  the final ``rms_norm``. Its attention-pooling head (``use_head=true``) and its native-resolution
  variant (``is_native``) have no option yet: refused by name.
* InternViT (InternVL's tower): the class token, LayerScale ``lambda_1``/``lambda_2``, q, k and v
  projected apart with or without biases (``attention_bias``), LayerNorm or RMSNorm (``norm_type``),
  no final norm with ``use_mean_pooling`` (what InternVL reads: the last block's tokens). Its
  qk-norm (``use_qk_norm``: InternViT-6B's, over the whole width, not per head) has no option yet.
* Pixtral: ``ln_pre`` (RMSNorm) is ``norm_pre`` and the patch convolution has no bias, its 2-D rotary
  bands (``rope_type='pixtral'``, base ``rope_parameters.rope_theta``), SwiGLU (``feed_forward``), no
  biases, no position table, class token or final norm; its RMSNorms' eps is the model's 1e-5.

Both are read as timm holds them (``vit_intern300m_patch14_448``, ``aimv2_large_patch14_224``): q, k
and v as one ``attn.qkv`` (their rows concatenated), and written from either. Every mapping is a
rename, a split or a concatenation (and AIMv2's table a reshape), so canonical -> transformers ->
canonical is bitwise. A config the layout cannot hold is refused naming each setting it would read back
otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.hf.common import ACT_BACK, act_of, sizes_from_hf, sizes_to_hf, strictly
from weights.hf.fields import Fields

AIMV2, INTERNVL, PIXTRAL = "aimv2_vision_model", "internvl_vision", "pixtral"
MODEL_TYPES = (AIMV2, INTERNVL, PIXTRAL)

# timm's names -> transformers' (a key's leading segments; in a block, after blocks.{i}.)
_OUTER = {
    AIMV2: {
        "patch_embed.proj": "embeddings.patch_embed",
        "patch_embed.norm": "embeddings.rms_norm",
        "pos_embed": "embeddings.position_embedding.weight",
        "norm": "rms_norm",
    },
    INTERNVL: {
        "cls_token": "embeddings.cls_token",
        "pos_embed": "embeddings.position_embeddings",
        "patch_embed.proj": "embeddings.patch_embeddings.projection",
        "norm": "layernorm",
    },
    PIXTRAL: {"patch_embed.proj": "patch_conv", "norm_pre": "ln_pre"},
}
_BLOCKS = {AIMV2: "encoder.layers", INTERNVL: "encoder.layer", PIXTRAL: "transformer.layers"}
_INNER = {
    AIMV2: {
        "attn.q_proj": "attention.q_proj",
        "attn.k_proj": "attention.k_proj",
        "attn.v_proj": "attention.v_proj",
        "attn.proj": "attention.out_proj",
        "mlp.fc1_g": "ffn.gate_proj",
        "mlp.fc1_x": "ffn.up_proj",
        "mlp.fc2": "ffn.down_proj",
        "norm1": "rms_norm1",
        "norm2": "rms_norm2",
    },
    INTERNVL: {
        "attn.q_proj": "attention.q_proj",
        "attn.k_proj": "attention.k_proj",
        "attn.v_proj": "attention.v_proj",
        "attn.proj": "attention.projection_layer",
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
        "ls1.gamma": "lambda_1",
        "ls2.gamma": "lambda_2",
        "mlp.fc1": "mlp.fc1",
        "mlp.fc2": "mlp.fc2",
    },
    PIXTRAL: {
        "attn.q_proj": "attention.q_proj",
        "attn.k_proj": "attention.k_proj",
        "attn.v_proj": "attention.v_proj",
        "attn.proj": "attention.o_proj",
        "mlp.fc1_g": "feed_forward.gate_proj",
        "mlp.fc1_x": "feed_forward.up_proj",
        "mlp.fc2": "feed_forward.down_proj",
        "norm1": "attention_norm",
        "norm2": "ffn_norm",
    },
}
# each tower's table as one rename of leading segments (the outer names, the blocks, their parts), in order
RENAME = {t: {**_OUTER[t], "blocks": _BLOCKS[t], **_INNER[t]} for t in MODEL_TYPES}
# Pixtral's RMSNorms: their eps is the model's own (1e-5), not a setting of its config.json
PIXTRAL_EPS = 1e-5


def tower_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from an Aimv2VisionConfig's or InternVLVisionConfig's config.json; what it has no
    option for refused by name."""
    f, model_type = Fields(hf), hf.get("model_type")
    if model_type == AIMV2:
        for key, why in (("use_head", "its attention-pooling head"), ("is_native", "its native-resolution table")):
            if f.flag(key, key == "use_head"):
                raise WeightError(f"{key}=true ({why}) has no option yet: the tower without it is expressible")
        return ViTConfig(
            **sizes_from_hf(f, 14), class_token=False, global_pool="avg", fc_norm=False, norm_layer="rmsnorm",
            norm_eps=f.number("rms_norm_eps", 1e-5), embed_norm=True, qkv_bias=f.flag("qkv_bias", False),
            proj_bias=False, mlp_bias=f.flag("mlp_bias", False) or None, mlp_layer="swiglu",
            act_layer=act_of(f, "silu"),
        )  # fmt: skip
    if model_type == PIXTRAL:
        return _pixtral_config_to_vit(f)
    if f.flag("use_qk_norm", False):
        raise WeightError(
            "use_qk_norm=true (InternViT-6B's qk-norm, over the whole width, not per head) has no option yet"
        )
    norm = f.text("norm_type", "layer_norm")
    if norm not in ("layer_norm", "rms_norm"):
        raise WeightError(f"norm_type {norm!r} is not supported; supported: ['layer_norm', 'rms_norm']")
    scale = float(f.number("layer_scale_init_value", 0.1, positive=False))
    return ViTConfig(
        **sizes_from_hf(f, 14), global_pool="token", final_norm=not f.flag("use_mean_pooling", True),
        qkv_bias=f.flag("attention_bias", False), norm_eps=f.number("layer_norm_eps", 1e-6),
        norm_layer="rmsnorm" if norm == "rms_norm" else "layernorm", act_layer=act_of(f),
        init_values=scale if scale > 0 else None,
        pos_embed="learn" if f.flag("use_absolute_position_embeddings", True) else "none",
    )  # fmt: skip


def _pixtral_config_to_vit(f: Fields) -> ViTConfig:
    """Pixtral's tower: RMSNorm before the blocks and in them, its 2-D rotary bands at ``rope_theta``,
    SwiGLU, no biases, no position table, class token or final norm."""
    sizes = sizes_from_hf(f, 14)
    head_dim = f.integer("head_dim", sizes["embed_dim"] // sizes["num_heads"])
    if head_dim * sizes["num_heads"] != sizes["embed_dim"]:
        raise WeightError(f"head_dim {head_dim} is not hidden_size / num_attention_heads: no option yet")
    rope = Fields(f.data.get("rope_parameters") or {}, "rope_parameters")
    if rope.text("rope_type", "axial") != "axial":
        raise WeightError(f"rope_parameters.rope_type {rope.text('rope_type')!r}: Pixtral's bands are 'axial'")
    return ViTConfig(
        **sizes, class_token=False, global_pool="avg", pos_embed="none", rope_type="pixtral", rope_rotate_half=True,
        rope_temperature=rope.number("rope_theta", f.number("rope_theta", 10000.0)), pre_norm=True,
        norm_layer="rmsnorm", norm_eps=PIXTRAL_EPS, final_norm=False, qkv_bias=False, proj_bias=False,
        mlp_layer="swiglu", act_layer=act_of(f),
    )  # fmt: skip


def tower_for(config: ViTConfig) -> str | None:
    """The tower layout a config is written as: AIMv2's (RMSNorm with a patch norm), InternViT's
    (LayerScale, the class token, no final norm), else None (another layout's)."""
    if config.norm_layer == "rmsnorm" and config.embed_norm:
        return AIMV2
    if config.rope_type == "pixtral":
        return PIXTRAL
    if config.init_values is not None and config.class_token and not config.use_final_norm and config.k_bias:
        return INTERNVL
    return None


def vit_config_to_tower(config: ViTConfig, model_type: str) -> dict:
    """The config.json of ``model_type``'s tower for ``config``, or a WeightError naming each
    setting the layout would read back otherwise."""
    sizes = {k: v for k, v in sizes_to_hf(config).items() if k != "layer_norm_eps"}
    if model_type == PIXTRAL:
        hf = dict(model_type=PIXTRAL, architectures=["PixtralVisionModel"], **sizes, head_dim=config.head_dim)
        hf["rope_parameters"] = {"rope_type": "axial", "rope_theta": config.rope_temperature}
    elif model_type == AIMV2:
        hf = dict(model_type=AIMV2, architectures=["Aimv2VisionModel"], **sizes, rms_norm_eps=config.norm_eps)
        hf.update(qkv_bias=config.qkv_bias, mlp_bias=config.use_mlp_bias, use_head=False, is_native=False)
    else:
        hf = dict(model_type=INTERNVL, architectures=["InternVLVisionModel"], **sizes, layer_norm_eps=config.norm_eps)
        hf.update(
            attention_bias=config.qkv_bias, use_qk_norm=False, use_mean_pooling=not config.final_norm,
            norm_type="rms_norm" if config.norm_layer == "rmsnorm" else "layer_norm",
            layer_scale_init_value=config.init_values or 0.0,
            use_absolute_position_embeddings=config.pos_embed == "learn",
        )  # fmt: skip
    hf["hidden_act"] = ACT_BACK[config.act_layer]
    back = tower_config_to_vit(hf)
    fields = [k for k in config.to_dict() if k != "qkv_fused"]  # q, k and v apart in the file, read as timm's qkv
    wrong = [f"{k}={getattr(config, k)!r}" for k in fields if getattr(config, k) != getattr(back, k)]
    if model_type == INTERNVL and config.init_values is None:
        wrong = wrong or ["no LayerScale (InternViT's lambda_1 and lambda_2)"]
    if wrong:
        raise WeightError(f"the Hugging Face {model_type} layout cannot hold {', '.join(wrong)}")
    return hf


def hf_settings(config: ViTConfig, model_type: str) -> dict:
    """The keywords of transformers' config class for ``model_type``'s tower (its config.json but
    the names of the model), refused as ``vit_config_to_tower`` refuses."""
    hf = vit_config_to_tower(config, model_type)
    return {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}


def _rename(key: str, model_type: str, back: bool = False) -> str | None:
    """A canonical key under ``model_type``'s names (``back``: the other way); None for a key the
    layout has no place for."""
    outer, inner = _OUTER[model_type], _INNER[model_type]
    blocks = re.fullmatch(rf"{re.escape(_BLOCKS[model_type]) if back else 'blocks'}\.(\d+)\.(.+)", key)
    if blocks:
        i, rest = blocks.groups()
        table = {v: k for k, v in inner.items()} if back else inner
        for a, b in table.items():
            if rest == a or rest.startswith(a + "."):
                rest = b + rest[len(a) :]
                break
        else:
            return None
        return f"{'blocks' if back else _BLOCKS[model_type]}.{i}.{rest}"
    table = {v: k for k, v in outer.items()} if back else outer
    for a, b in sorted(table.items(), key=lambda kv: -len(kv[0])):  # patch_embed.norm before norm
        if key == a or key.startswith(a + "."):
            return b + key[len(a) :]
    return None


def _apart(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """timm's fused attn.qkv as q_proj, k_proj and v_proj: its rows in thirds, (3, heads, head_dim)."""
    out = {}
    for key, value in state.items():
        fused = re.fullmatch(r"(blocks\.\d+\.attn)\.qkv\.(weight|bias)", key)
        if not fused:
            out[key] = value
            continue
        for part, rows in zip("qkv", np.split(np.asarray(value), 3)):
            out[f"{fused[1]}.{part}_proj.{fused[2]}"] = np.ascontiguousarray(rows)
    return out


def _fused(state: dict[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """q_proj, k_proj and v_proj as timm's fused attn.qkv (the canonical form of both towers)."""
    for i in range(config.depth):
        for leaf in ("weight", "bias"):
            parts = [state.pop(f"blocks.{i}.attn.{p}_proj.{leaf}", None) for p in "qkv"]
            if all(p is not None for p in parts):
                state[f"blocks.{i}.attn.qkv.{leaf}"] = np.concatenate(parts)
    return state


def to_tower(state: Mapping[str, np.ndarray], config: ViTConfig, model_type: str) -> dict[str, np.ndarray]:
    vit_config_to_tower(config, model_type)  # refuses what the layout cannot hold
    out = {}
    for key, value in (_apart(state) if config.qkv_fused else state).items():
        theirs = _rename(key, model_type)
        if theirs is None:
            raise WeightError(f"canonical key {key!r} has no place in the Hugging Face {model_type} layout")
        out[theirs] = np.asarray(value)[0] if (model_type == AIMV2 and key == "pos_embed") else np.asarray(value)
    return out


def from_tower(state: Mapping[str, np.ndarray], config: ViTConfig, model_type: str) -> dict[str, np.ndarray]:
    """The canonical state of a tower's tensors, strictly: a tensor with no canonical place named."""
    out = {}
    for key, value in state.items():
        ours = _rename(key, model_type, back=True)
        if ours is None:
            raise WeightError(f"{key!r} has no canonical place ({model_type}: no option expresses it)")
        out[ours] = value[None] if (model_type == AIMV2 and ours == "pos_embed") else value
    return strictly(_fused(out, config), config, model_type)
