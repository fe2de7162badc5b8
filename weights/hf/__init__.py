"""Hugging Face layouts, to and from the canonical (timm) state, in one package: ``vit`` (the
original ViT), ``family`` (the ViT family's towers), and here reading and writing a checkpoint
directory.

* ``vit`` (``ViTForImageClassification``, ``ViTModel``): separate query/key/value,
  ``layernorm_before`` and ``layernorm_after``, settings (``layer_norm_eps`` among them) from
  ``config.json``.
* ``dinov2`` (``Dinov2Model``): ``layer_scale{1,2}.lambda1`` are timm's ``ls{1,2}.gamma``; the
  SwiGLU FFN's ``weights_in`` is timm's packed ``fc1`` (gate rows first). ``mask_token`` is
  used only with ``bool_masked_pos`` (training): it is dropped on import and written as zeros.
* ``dinov2_with_registers``: the position embedding keeps an entry for the class token and
  ``register_tokens`` get none; timm (``no_embed_class=True``) folds that entry into
  ``cls_token`` on import (pytorch-image-models#2014), and it is written back as zero.
* ``clip_vision_model`` (and a whole ``clip`` checkpoint's vision tower): no patch bias,
  ``pre_layrnorm`` is ``norm_pre``, ``post_layernorm`` is the final ``norm`` (Hugging Face
  applies it to the class token only, which is the same pooled feature), ``visual_projection``
  (no bias) is the head, with a zero bias.
* ``siglip_vision_model`` (and a ``siglip`` checkpoint's vision tower): no class token, the
  MAP head ``head.*`` is timm's ``attn_pool`` (``in_proj_weight`` rows are q, k, v).
* ``dinov3_vit`` (``DINOv3ViTModel``, ``dinov3``): timm's Eva with DINOv3's rotation, q, k and
  v projected apart, LayerScale ``lambda1``, a plain or gated MLP (weights/hf/dinov3.py).
* ``beit`` (``BeitModel``, ``BeitForImageClassification``): timm's Beit, its relative position
  bias per layer, q's and v's biases and k none, LayerScale ``lambda_1`` (weights/hf/beit.py).
* ``siglip2_vision_model`` (``Siglip2VisionModel``, a ``siglip2`` checkpoint's vision tower):
  SigLIP's tower on NaFlex's patches, one square table resized bilinearly (weights/hf/siglip2.py).
* ``aimv2_vision_model`` (``Aimv2VisionModel``) and ``internvl_vision`` (``InternVLVisionModel``):
  AIMv2's RMSNorm and SwiGLU tower, InternViT's tower without a final norm (weights/hf/towers.py).
* ``qwen2_5_vl_vision`` (``Qwen2_5_VisionTransformerPretrainedModel``): Qwen2.5-VL's tower up to its
  merger, its windows cut at the image's edge, its Conv3d's frames summed (weights/hf/qwen2_5_vl.py).
* ``sam_vision_model`` (``SamVisionModel``): SAM's image encoder up to its neck, timm's
  ``VisionTransformerSAM`` under transformers' names, its table on the grid (weights/hf/sam.py).

Every mapping is a rename, a split or a concatenation (and the class-token fold, a float32
sum with an entry written back as zero), so canonical -> Hugging Face -> canonical is bitwise.
Settings come from config.json; a setting the canonical form cannot hold is refused by name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.files import read_timm, stored_float32
from weights.hf.fields import Fields

from weights.hf.family import (
    FAMILY_MODEL_TYPES,
    vision_config,
    family_config_to_vit,
    model_type_for,
    family_config_to_hf,
    from_family_hf,
    to_family_hf,
)
from weights.hf import beit, dinov3, qwen2_5_vl, sam, siglip2, towers
from weights.hf.vit import (
    in_memory_names,
    hf_config_to_vit,
    vit_config_to_hf,
    from_hf,
    to_hf,
)


def read_hf(path: str | os.PathLike, cast: bool = False) -> tuple[dict[str, np.ndarray], ViTConfig]:
    """A save_pretrained directory (config.json + model.safetensors or pytorch_model.bin): ViT,
    or a family model (the family's layouts above). Its tensors are float32, or cast to it with
    ``cast`` (files.stored_float32), by their own names before they are mapped."""

    d = Path(path)
    if not (d / "config.json").is_file():
        raise WeightError(f"{str(d)!r} has no config.json: not a Hugging Face checkpoint directory")
    try:
        hf = json.loads((d / "config.json").read_text())
    except (ValueError, RecursionError) as e:
        raise WeightError(f"{str(d / 'config.json')!r} is not readable JSON: {e}") from None
    if not isinstance(hf, dict):
        raise WeightError(f"{str(d / 'config.json')!r} holds a {type(hf).__name__}, expected a JSON object")
    Fields(hf).text("model_type")  # what selects the layout: a string, or the user's file is named
    files = [d / name for name in ("model.safetensors", "pytorch_model.bin") if (d / name).is_file()]
    if not files:
        raise WeightError(f"{str(d)!r} has neither model.safetensors nor pytorch_model.bin")
    raw = read_timm(files[0])
    config, mapped = _config_and_mapping(hf, raw)
    return mapped(stored_float32(raw, cast, files[0]), config), config


def _config_and_mapping(hf: dict, raw: dict[str, np.ndarray]):
    """The config a config.json gives, and the function that maps its model's tensors to canonical."""
    model_type, _ = vision_config(hf)
    if hf.get("model_type") in (siglip2.MODEL_TYPE, "siglip2"):
        return siglip2.siglip2_config_to_vit(hf), siglip2.from_siglip2
    if model_type == dinov3.MODEL_TYPE:
        return dinov3.dinov3_config_to_vit(hf), dinov3.from_dinov3
    if model_type == beit.MODEL_TYPE:
        return beit.beit_config_to_vit(hf), beit.from_beit
    if model_type in towers.MODEL_TYPES:
        return towers.tower_config_to_vit(hf), lambda state, config: towers.from_tower(state, config, model_type)
    if model_type == qwen2_5_vl.MODEL_TYPE:
        return qwen2_5_vl.qwen2_5_vl_config_to_vit(hf), qwen2_5_vl.from_qwen2_5_vl
    if model_type == sam.MODEL_TYPE:
        return sam.sam_config_to_vit(hf), sam.from_sam
    if model_type in ("vit", "deit"):
        return hf_config_to_vit(hf), from_hf
    return family_config_to_vit(hf, raw), lambda state, config: from_family_hf(state, config, model_type)


def write_hf(state, config: ViTConfig, path) -> None:
    """The original ViT as ViTForImageClassification; a family config as the Hugging Face model
    that holds it (Dinov2, Dinov2 with registers, CLIP's or SigLIP's vision tower, DINOv3, BEiT,
    AIMv2's or InternViT's tower)."""
    from safetensors.numpy import save_file

    if config.pos_embed_interp_mode == "bilinear":  # NaFlex's table, resized as SigLIP 2 resizes it
        hf, tensors = siglip2.vit_config_to_siglip2(config), siglip2.to_siglip2(state, config)
    elif config.rope_type == "dinov3":
        hf, tensors = dinov3.vit_config_to_dinov3(config), dinov3.to_dinov3(state, config)
    elif config.rel_pos_bias or (not config.k_bias and config.rope_type is None):  # BEiT's attention
        hf, tensors = beit.vit_config_to_beit(config), beit.to_beit(state, config)
    elif config.use_rel_pos or (config.window_size and config.window_partition == "pad"):  # SAM's encoder
        hf, tensors = sam.vit_config_to_sam(config), sam.to_sam(state, config)
    elif config.window_partition == "truncate":  # Qwen2.5-VL's windows
        hf, tensors = qwen2_5_vl.vit_config_to_qwen2_5_vl(config), qwen2_5_vl.to_qwen2_5_vl(state, config)
    elif (tower := towers.tower_for(config)) is not None:  # AIMv2's or InternViT's
        hf, tensors = towers.vit_config_to_tower(config, tower), towers.to_tower(state, config, tower)
    elif config.beyond_original_vit() and config.beyond_original_vit() != ["distilled=True"]:
        hf, tensors = family_config_to_hf(config), to_family_hf(state, config)
    else:
        hf, tensors = vit_config_to_hf(config), to_hf(state, config)
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


__all__ = [
    "FAMILY_MODEL_TYPES",
    "family_config_to_hf",
    "family_config_to_vit",
    "from_family_hf",
    "from_hf",
    "hf_config_to_vit",
    "model_type_for",
    "read_hf",
    "to_family_hf",
    "to_hf",
    "in_memory_names",
    "vision_config",
    "vit_config_to_hf",
    "write_hf",
]
