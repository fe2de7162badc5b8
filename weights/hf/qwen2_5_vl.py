"""transformers' Qwen2.5-VL vision tower (``Qwen2_5_VisionTransformerPretrainedModel``, model_type
``qwen2_5_vl_vision``) up to its merger: config.json to and from a ``ViTConfig``, the state to and
from canonical.

Its blocks are timm's but for the MLP's names (``mlp.gate_proj`` is timm's ``fc1_g``, ``up_proj``
its ``fc1_x``, ``down_proj`` its ``fc2``): RMSNorm (eps 1e-6, the model's own), a fused ``attn.qkv``
with biases, Qwen2-VL's rotation (timm's 'cat' bands as halves, base ``rope_parameters.rope_theta``),
no position table, class token or final norm. Its windows: ``window_size`` pixels, cut at the
image's edge (``window_partition='truncate'``, ``window_size`` in patches), but in
``fullatt_block_indexes`` (``global_attn_indexes``). It takes images of any size (its processor's
multiples of 28 pixels): ``dynamic_img_size``, at 448 pixels.

Its patch projection is a Conv3d over ``temporal_patch_size`` frames, (D, C, T, p, p): an image is
given as T identical frames, so the kernel that acts on it is the frames' sum, read as timm's
(D, C, p, p) (one rounding per weight); written back as the first frame, the others zero, so that
canonical -> transformers -> canonical is bitwise. Its merger (``merger.*``: an RMSNorm and an MLP
over 2 x 2 merge groups, the projector into the language model) is after the tower, where verify's
``ModelPort(tower=...)`` stops: it has no canonical place and is refused by name (save the tower
with ``model.merger = torch.nn.Identity()`` to import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.hf.common import ACT_BACK, act_of, refuse_after_tower, renamed, strictly
from weights.hf.fields import Fields

MODEL_TYPE = "qwen2_5_vl_vision"
IMG_SIZE = 448  # any multiple of 28 pixels is an input of the tower: the config's own grid is 32 x 32
EPS = 1e-6  # Qwen2_5_VLRMSNorm's default, not a setting of its config.json
FRAMES, MERGE = 2, 2  # its defaults: two frames a patch, 2 x 2 merge groups
_MLP = {"fc1_g": "gate_proj", "fc1_x": "up_proj", "fc2": "down_proj"}


def qwen2_5_vl_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a Qwen2_5_VLVisionConfig's config.json; what it has no option for refused by name."""
    f = Fields(hf)
    D, p = f.integer("hidden_size"), f.integer("patch_size", 14)
    merge, window = f.integer("spatial_merge_size", MERGE), f.integer("window_size", 112)
    if window % (p * merge):
        raise WeightError(
            f"window_size {window} is not a whole number of {merge} x {merge} merge groups of {p}-pixel patches "
            f"({p * merge} pixels): Qwen2.5-VL's windows are whole merge groups"
        )
    full = hf.get("fullatt_block_indexes", [])
    depth = f.depth("depth")
    if not isinstance(full, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in full):
        raise WeightError(f"config.json's fullatt_block_indexes is {full!r}: expected a list of block indexes")
    rope = Fields(f.data.get("rope_parameters") or {}, "rope_parameters")
    return ViTConfig(
        img_size=IMG_SIZE, patch_size=p, in_chans=f.integer("in_channels", 3), num_classes=0, embed_dim=D,
        depth=depth, num_heads=f.integer("num_heads"), mlp_ratio=f.mlp_ratio("intermediate_size", D, 4 * D),
        class_token=False, global_pool="avg", final_norm=False, pos_embed="none", rope_type="cat",
        rope_rotate_half=True, rope_temperature=rope.number("rope_theta", 10000.0), patch_bias=False,
        norm_layer="rmsnorm", norm_eps=EPS, mlp_layer="swiglu", act_layer=act_of(f, "silu"), dynamic_img_size=True,
        window_size=window // p, window_partition="truncate", global_attn_indexes=tuple(sorted(set(full))),
    )  # fmt: skip


def vit_config_to_qwen2_5_vl(config: ViTConfig) -> dict:
    """The config.json of Qwen2.5-VL's tower for ``config``, or a WeightError naming each setting the
    layout would read back otherwise."""
    p = config.patch_size[0]
    hf = dict(
        model_type=MODEL_TYPE, architectures=["Qwen2_5_VisionTransformerPretrainedModel"], depth=config.depth,
        hidden_size=config.embed_dim, hidden_act=ACT_BACK[config.act_layer], intermediate_size=config.mlp_hidden_dim,
        num_heads=config.num_heads, in_channels=config.in_chans, patch_size=p, spatial_merge_size=MERGE,
        temporal_patch_size=FRAMES, window_size=config.window_size * p, out_hidden_size=config.embed_dim,
        fullatt_block_indexes=list(config.global_attn_indexes),
        rope_parameters={"rope_type": "axial", "rope_theta": config.rope_temperature},
    )  # fmt: skip
    back = qwen2_5_vl_config_to_vit(hf)
    shown = {"img_size", "dynamic_img_size", "qkv_fused"}  # any image size; q, k, v fused in both
    wrong = [
        f"{k}={getattr(config, k)!r}"
        for k in config.to_dict()
        if k not in shown and getattr(config, k) != getattr(back, k)
    ]
    if config.patch_size[0] != config.patch_size[1]:
        wrong.append(f"patch_size={config.patch_size!r}")
    if wrong:
        raise WeightError(f"the Hugging Face {MODEL_TYPE} layout cannot hold {', '.join(wrong)}")
    return hf


def _rename(key: str, back: bool = False) -> str | None:
    """A canonical key under Qwen2.5-VL's names (``back``: the other way); None where it has no place."""
    table = {v: k for k, v in _MLP.items()} if back else _MLP
    m = re.fullmatch(r"blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.(\w+))\.(weight|bias)", key)
    if m is None:
        return "patch_embed.proj.weight" if key == "patch_embed.proj.weight" else None
    part = m[2] if m[3] is None else f"mlp.{table.get(m[3], '')}"
    return None if part == "mlp." else f"blocks.{m[1]}.{part}.{m[4]}"


def to_qwen2_5_vl(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    vit_config_to_qwen2_5_vl(config)  # refuses what the layout cannot hold
    return renamed(state, MODEL_TYPE, _rename, _frames)


def _frames(key: str, value):
    """The patch kernel as the first frame's, the others zero (their sum is it)."""
    value = np.asarray(value)
    if key != "patch_embed.proj.weight":
        return value
    return np.stack([value] + [np.zeros_like(value)] * (FRAMES - 1), axis=2)


def _summed(key: str, value):
    """A Conv3d kernel (D, C, T, p, p) as the frames an image repeats, summed: timm's (D, C, p, p)."""
    if key != "patch_embed.proj.weight":
        return value
    value = np.asarray(value)
    if value.ndim != 5:
        raise WeightError(f"patch_embed.proj.weight is {value.shape}: expected a Conv3d kernel (D, C, T, p, p)")
    return value.sum(axis=2, dtype=value.dtype)


def from_qwen2_5_vl(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """The canonical state of the tower's tensors, strictly: its merger and any other tensor with no
    canonical place named."""
    refuse_after_tower(state, "merger.", "merger (its projector into the language model)", MODEL_TYPE, "model.merger")
    out = renamed(state, MODEL_TYPE, lambda key: _rename(key, back=True), _summed, back=True)
    return strictly(out, config, MODEL_TYPE)
