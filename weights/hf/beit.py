"""transformers' BEiT (``BeitModel``, ``BeitForImageClassification``, model_type ``beit``):
config.json to and from a ``ViTConfig``, the state to and from canonical.

The model is timm's Beit: q's and v's biases and none for k (``k_bias=False``; transformers
projects q, k and v apart: ``query``, ``key``, ``value``, timm's fused ``qkv`` split in its rows'
order, so both directions are bitwise), LayerScale ``lambda_1``/``lambda_2`` where
``layer_scale_init_value`` > 0, a relative position bias per layer
(``use_relative_position_bias``: ``rel_pos_bias``) and, or, a learned table
(``use_absolute_position_embeddings``), and the patch tokens' mean through the pooler's
layernorm (``use_mean_pooling``: timm's ``fc_norm`` under ``global_pool='avg'``) or the class
token after the final ``layernorm``. The names are those the checkpoints hold (the hub's and
``save_pretrained``'s: ``encoder.layer.{i}.attention.attention.query``), under ``beit.`` with a
classifier, without it for ``BeitModel``. One table shared by every layer
(``use_shared_relative_position_bias``) is not expressible; ``mask_token`` (masked-image
pretraining's) is dropped on import.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, expected_shapes
from weights.config import ViTConfig
from weights.hf.fields import Fields
from weights.hf.common import act_of, refuse, sizes_to_hf
from weights.options import holds

MODEL_TYPE = "beit"
HOLDS = holds(f"hf:{MODEL_TYPE}")  # weights/options.py


def beit_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a BeitConfig's config.json; every setting taken, none assumed."""
    f = Fields(hf)
    if f.flag("use_shared_relative_position_bias", False):
        raise WeightError(
            "use_shared_relative_position_bias=true (one relative position table for every layer) is not "
            "expressible: rel_pos_bias gives each block its own attn.relative_position_bias_table"
        )
    D = f.integer("hidden_size")
    scale = float(f.number("layer_scale_init_value", 0.1, positive=False))
    classify = any(a.endswith("ForImageClassification") for a in f.strings("architectures"))
    return ViTConfig(
        img_size=f.size("image_size", 224),
        patch_size=f.size("patch_size", 16),
        in_chans=f.integer("num_channels", 3),
        num_classes=f.num_labels(0) if classify else 0,
        global_pool="avg" if f.flag("use_mean_pooling", True) else "token",
        embed_dim=D,
        depth=f.depth(),
        num_heads=f.integer("num_attention_heads"),
        mlp_ratio=f.mlp_ratio("intermediate_size", D, 3072),
        k_bias=False,
        act_layer=act_of(f),
        norm_eps=f.number("layer_norm_eps", 1e-12),
        init_values=scale if scale > 0 else None,
        pos_embed="learn" if f.flag("use_absolute_position_embeddings", False) else "none",
        rel_pos_bias=f.flag("use_relative_position_bias", False),
    )


def vit_config_to_beit(config: ViTConfig) -> dict:
    dynamic = ["dynamic_img_size=True (transformers' BEiT interpolates only when asked at each call)"]
    refuse(config, MODEL_TYPE, HOLDS, dynamic if config.dynamic_img_size else [])
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["BeitForImageClassification" if config.num_classes else "BeitModel"],
        **sizes_to_hf(config),
        "layer_scale_init_value": config.init_values or 0.0,
        "use_absolute_position_embeddings": config.pos_embed == "learn",
        "use_relative_position_bias": config.rel_pos_bias,
        "use_shared_relative_position_bias": False,
        "use_mean_pooling": config.global_pool == "avg",
        "use_mask_token": False,
        **({"id2label": {str(i): f"LABEL_{i}" for i in range(config.num_classes)}} if config.num_classes else {}),
    }


# Canonical names -> the checkpoints': outside the blocks, and within a block (``blocks.{i}``,
# theirs ``encoder.layer.{i}``) by module, LayerScale and the table by their whole names
OUTSIDE = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj": "embeddings.patch_embeddings.projection",
    "norm": "layernorm",
    "fc_norm": "pooler.layernorm",
}
BLOCK = {
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "ls1.gamma": "lambda_1",
    "ls2.gamma": "lambda_2",
    "attn.q_bias": "attention.attention.query.bias",
    "attn.v_bias": "attention.attention.value.bias",
    "attn.relative_position_bias_table": "attention.attention.relative_position_bias.relative_position_bias_table",
    "attn.proj": "attention.output.dense",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
_QKV = ("query", "key", "value")  # attn.qkv.weight's row thirds


def _theirs(key: str) -> str | None:
    """A canonical key's checkpoint name (under ``beit.`` for a classifier), or None for qkv's weight."""
    if key.startswith("head."):
        return f"classifier.{key.split('.')[-1]}"
    if key.startswith("blocks."):
        _, i, rest = key.split(".", 2)
        module, _, param = rest.rpartition(".")
        name = BLOCK.get(rest) or (f"{BLOCK[module]}.{param}" if module in BLOCK else None)
        return None if name is None else f"beit.encoder.layer.{i}.{name}"
    module, _, param = key.rpartition(".")
    name = OUTSIDE.get(key) or (f"{OUTSIDE[module]}.{param}" if module in OUTSIDE else None)
    return None if name is None else f"beit.{name}"


def _qkv_names(i: int) -> list[str]:
    return [f"beit.encoder.layer.{i}.attention.attention.{p}.weight" for p in _QKV]


def from_beit(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """A BEiT checkpoint (``beit.``-prefixed with a classifier, or a BeitModel's) -> canonical."""
    if not any(k.startswith("beit.") for k in state):
        state = {f"beit.{k}": v for k, v in state.items()}
    vit_config_to_beit(config)  # refuses what the layout cannot hold
    out, used = {}, set()
    for key in expected_shapes(config):
        if key.endswith("attn.qkv.weight"):
            parts = _qkv_names(int(key.split(".")[1]))
            missing = [p for p in parts if p not in state]
            if missing:
                raise WeightError(f"Hugging Face {MODEL_TYPE} checkpoint is missing keys {missing} for {config}")
            out[key] = np.concatenate([np.asarray(state[p]) for p in parts])
            used.update(parts)
            continue
        theirs = _theirs(key)
        if theirs not in state:
            raise WeightError(f"Hugging Face {MODEL_TYPE} checkpoint is missing key {theirs!r} for {config}")
        out[key] = np.ascontiguousarray(state[theirs])
        used.add(theirs)
    unknown = sorted(k for k in set(state) - used if not k.endswith("mask_token"))
    if unknown:
        raise WeightError(f"Hugging Face {MODEL_TYPE} checkpoint has keys {unknown[:4]} that {config} has no place for")
    return out


def to_beit(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    vit_config_to_beit(config)
    out = {}
    for key in expected_shapes(config):
        if key.endswith("attn.qkv.weight"):
            out.update(zip(_qkv_names(int(key.split(".")[1])), np.split(np.asarray(state[key]), 3)))
        else:
            out[_theirs(key)] = np.asarray(state[key])
    if not config.num_classes:  # BeitModel's own names
        out = {k.removeprefix("beit."): v for k, v in out.items()}
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
