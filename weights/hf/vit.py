"""transformers' original ViT (``ViTForImageClassification``, ``ViTModel``) and DeiT's distilled
model (``DeiTForImageClassificationWithTeacher``: ViT's layers under ``deit.``, a distillation
token, ``cls_classifier`` and ``distillation_classifier``): config.json to and from a
``ViTConfig``, the state to and from canonical."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError, expected_shapes
from weights.config import ViTConfig
from weights.hf.common import sizes_from_hf, sizes_to_hf
from weights.hf.fields import Fields


_HF_BLOCK = {
    "layernorm_before": "norm1",
    "attention.output.dense": "attn.proj",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}


def hf_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a Hugging Face ViT config.json: every setting taken, none assumed."""
    f = Fields(hf)
    if hf.get("model_type") not in ("vit", "deit"):
        raise WeightError(
            f"config.json has model_type {hf.get('model_type')!r}, expected 'vit' or 'deit' (or a family model: "
            "dinov2, dinov2_with_registers, clip_vision_model, siglip_vision_model, clip, siglip)"
        )
    distilled = hf["model_type"] == "deit"
    architectures = f.strings("architectures") or [DEIT]
    if distilled and architectures[0] != DEIT:
        raise WeightError(
            f"a DeiT checkpoint of {architectures[0]} has a distillation token but not both heads: only "
            f"{DEIT}'s (class and distillation classifiers, their mean) is a model the config expresses"
        )
    if f.text("hidden_act", "gelu") != "gelu":
        raise WeightError(f"hidden_act {hf['hidden_act']!r} is not supported: the ports use exact GELU ('gelu')")
    return ViTConfig(
        **(sizes_from_hf(f) | {"num_classes": f.num_labels(2)}),  # a classifier: its labels' count
        global_pool="token",
        class_token=True,
        qkv_bias=f.flag("qkv_bias", True),
        norm_eps=f.number("layer_norm_eps", 1e-12),
        distilled=distilled,
    )


DEIT = "DeiTForImageClassificationWithTeacher"


def _original_vit_only(config: ViTConfig, layout: str) -> None:
    """A layout of the original ViT cannot hold the family's options: refuse rather than drop
    (a LayerScale gamma silently left behind is mlx-image#26)."""
    beyond = config.beyond_original_vit()
    if beyond:
        raise WeightError(
            f"the {layout} layout holds the original ViT, not {', '.join(beyond)}: writing it would drop those weights"
        )


def vit_config_to_hf(config: ViTConfig) -> dict:
    distilled = config.distilled
    config = config.replace(distilled=False)
    _original_vit_only(config, f"Hugging Face {'DeiT' if distilled else 'ViT'}")
    if config.global_pool != "token" or not config.class_token:
        raise WeightError(
            "Hugging Face ViTForImageClassification pools the class token: global_pool='avg' has no Hugging Face layout"
        )
    return {
        "architectures": [DEIT if distilled else "ViTForImageClassification"],
        "model_type": "deit" if distilled else "vit",
        **sizes_to_hf(config),
        "qkv_bias": config.qkv_bias,
        "id2label": {str(i): f"LABEL_{i}" for i in range(config.num_classes)},
        "label2id": {f"LABEL_{i}": i for i in range(config.num_classes)},
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }


# transformers 5 holds its ViT's layers under new module names (q_proj, o_proj, mlp.fc1) and
# converts the 4.x names its files keep on load and on save: the file names, then the names a
# transformers-5 model's own state_dict has.
_RENAMES = (  # (a block's module in the files, in a transformers-5 model)
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
    ("attention.output.dense", "attention.o_proj"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
)
_IN_MEMORY = tuple((rf"encoder\.layer\.(\d+)\.{re.escape(f)}\.", rf"layers.\1.{m}.") for f, m in _RENAMES)
_IN_MEMORY += ((r"encoder\.layer\.(\d+)\.", r"layers.\1."),)
# ``_IN_MEMORY`` undone: a transformers-5 model's own state_dict in the file names
_FILE = tuple((rf"layers\.(\d+)\.{re.escape(m)}\.", rf"encoder.layer.\1.{f}.") for f, m in _RENAMES)
_FILE += ((r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),)


def _renamed(state: Mapping[str, np.ndarray], table) -> dict[str, np.ndarray]:
    """``state`` with each key renamed by the first (pattern, replacement) of ``table`` it matches."""

    def name(key: str) -> str:
        for pattern, new in table:
            key, n = re.subn(pattern, new, key)
            if n:
                break
        return key

    return {name(k): v for k, v in state.items()}


def in_memory_names(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A ViT state in transformers' file names (what ``to_hf`` writes) under the names a
    transformers-5 model holds in memory, for its ``load_state_dict``."""
    return _renamed(state, _IN_MEMORY)


def from_hf(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """Canonical from transformers' ViT state, in its files' names or a transformers-5 model's own."""
    state = _renamed(state, _FILE)
    prefix = "deit." if config.distilled else "vit."
    s = {k.removeprefix(prefix): v for k, v in state.items() if not k.startswith(prefix + "pooler.")}
    out = {}
    try:
        if config.distilled:
            out["dist_token"] = s["embeddings.distillation_token"]
            for ours, theirs in (("head", "cls_classifier"), ("head_dist", "distillation_classifier")):
                if config.num_classes:
                    out[f"{ours}.weight"], out[f"{ours}.bias"] = s[f"{theirs}.weight"], s[f"{theirs}.bias"]
        out["cls_token"] = s["embeddings.cls_token"]
        out["pos_embed"] = s["embeddings.position_embeddings"]
        out["patch_embed.proj.weight"] = s["embeddings.patch_embeddings.projection.weight"]
        out["patch_embed.proj.bias"] = s["embeddings.patch_embeddings.projection.bias"]
        for i in range(config.depth):
            hf, b = f"encoder.layer.{i}.", f"blocks.{i}."
            att = hf + "attention.attention."
            # timm's fused rows are (3, heads, head_dim): q rows, then k rows, then v rows.
            out[b + "attn.qkv.weight"] = np.concatenate([s[att + n + ".weight"] for n in ("query", "key", "value")])
            if config.qkv_bias:
                out[b + "attn.qkv.bias"] = np.concatenate([s[att + n + ".bias"] for n in ("query", "key", "value")])
            for hf_name, timm_name in _HF_BLOCK.items():
                out[f"{b}{timm_name}.weight"] = s[f"{hf}{hf_name}.weight"]
                out[f"{b}{timm_name}.bias"] = s[f"{hf}{hf_name}.bias"]
        out["norm.weight"], out["norm.bias"] = s["layernorm.weight"], s["layernorm.bias"]
        if config.num_classes and not config.distilled:
            out["head.weight"], out["head.bias"] = state["classifier.weight"], state["classifier.bias"]
    except KeyError as e:
        raise WeightError(f"Hugging Face checkpoint is missing key {e.args[0]!r} for {config}") from None
    return {k: out[k] for k in expected_shapes(config)}


def to_hf(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """transformers' ViT state in its files' names (``in_memory_names`` gives a transformers-5
    model's own, for ``load_state_dict``)."""
    vit_config_to_hf(config)  # refuses layouts Hugging Face cannot hold
    D, p = config.embed_dim, "deit." if config.distilled else "vit."
    out = {
        f"{p}embeddings.cls_token": state["cls_token"],
        f"{p}embeddings.position_embeddings": state["pos_embed"],
        f"{p}embeddings.patch_embeddings.projection.weight": state["patch_embed.proj.weight"],
        f"{p}embeddings.patch_embeddings.projection.bias": state["patch_embed.proj.bias"],
    }
    if config.distilled:
        out["deit.embeddings.distillation_token"] = state["dist_token"]
    for i in range(config.depth):
        hf, b = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        for j, n in enumerate(("query", "key", "value")):
            out[f"{hf}attention.attention.{n}.weight"] = state[b + "attn.qkv.weight"][j * D : (j + 1) * D]
            if config.qkv_bias:
                out[f"{hf}attention.attention.{n}.bias"] = state[b + "attn.qkv.bias"][j * D : (j + 1) * D]
        for hf_name, timm_name in _HF_BLOCK.items():
            out[f"{hf}{hf_name}.weight"] = state[f"{b}{timm_name}.weight"]
            out[f"{hf}{hf_name}.bias"] = state[f"{b}{timm_name}.bias"]
    out[f"{p}layernorm.weight"], out[f"{p}layernorm.bias"] = state["norm.weight"], state["norm.bias"]
    heads = (
        (("head", "cls_classifier"), ("head_dist", "distillation_classifier"))
        if config.distilled
        else (("head", "classifier"),)
    )
    for ours, theirs in heads if config.num_classes else ():
        out[f"{theirs}.weight"], out[f"{theirs}.bias"] = state[f"{ours}.weight"], state[f"{ours}.bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
