"""transformers' SAM image encoder (``SamVisionModel``, model_type ``sam_vision_model``) up to its neck:
config.json to and from a ``ViTConfig``, the state to and from canonical.

timm's ``VisionTransformerSAM`` under transformers' names (``vision_encoder.layers.{i}``,
``layer_norm1``/``layer_norm2`` as ``norm1``/``norm2``, ``mlp.lin1``/``lin2`` as ``fc1``/``fc2``,
``patch_embed.projection`` as ``patch_embed.proj``): windows of ``window_size`` patches padded to
whole ones but in ``global_attn_indexes``, decomposed relative positions (``attn.rel_pos_h``/``_w``),
its position table on the grid, (1, gh, gw, D), as the canonical (1, gh gw, D); no class token, no
final norm. Every mapping is a rename or that reshape: canonical -> transformers -> canonical is
bitwise. Its neck (``neck.*``: two convolutions, each with a channels-first LayerNorm) is after the
tower, where verify's ``ModelPort(tower=...)`` stops: it has no canonical place and is refused by
name (save the encoder with ``model.vision_encoder.neck = torch.nn.Identity()`` to import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.hf.common import ACT_BACK, act_of, refuse_after_tower, renamed, strictly
from weights.hf.fields import Fields

MODEL_TYPE = "sam_vision_model"
_PREFIX = "vision_encoder."
_PARTS = {"norm1": "layer_norm1", "norm2": "layer_norm2", "mlp.fc1": "mlp.lin1", "mlp.fc2": "mlp.lin2"}


def sam_config_to_vit(hf: Mapping) -> ViTConfig:
    """ViTConfig from a SamVisionConfig's config.json; what it has no option for refused by name."""
    f = Fields(hf)
    D, full = f.integer("hidden_size"), hf.get("global_attn_indexes", [])
    if not isinstance(full, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in full):
        raise WeightError(f"config.json's global_attn_indexes is {full!r}: expected a list of block indexes")
    return ViTConfig(
        img_size=f.size("image_size", 1024), patch_size=f.size("patch_size", 16), in_chans=f.integer("num_channels", 3),
        num_classes=0, embed_dim=D, depth=f.depth(), num_heads=f.integer("num_attention_heads"),
        mlp_ratio=f.mlp_ratio("mlp_dim", D, 4 * D), class_token=False, global_pool="avg", final_norm=False,
        qkv_bias=f.flag("qkv_bias", True), norm_eps=f.number("layer_norm_eps", 1e-6), act_layer=act_of(f),
        pos_embed="learn" if f.flag("use_abs_pos", True) else "none", use_rel_pos=f.flag("use_rel_pos", True),
        window_size=f.integer("window_size", 14, minimum=0), global_attn_indexes=tuple(sorted(set(full))),
    )  # fmt: skip


def vit_config_to_sam(config: ViTConfig) -> dict:
    """The config.json of SAM's image encoder for ``config``, or a WeightError naming each setting
    the layout would read back otherwise."""
    (size, _), (patch, _) = config.img_size, config.patch_size
    hf = dict(
        model_type=MODEL_TYPE, architectures=["SamVisionModel"], hidden_size=config.embed_dim,
        num_hidden_layers=config.depth, num_attention_heads=config.num_heads, num_channels=config.in_chans,
        image_size=size, patch_size=patch, hidden_act=ACT_BACK[config.act_layer], layer_norm_eps=config.norm_eps,
        qkv_bias=config.qkv_bias, mlp_dim=config.mlp_hidden_dim, use_abs_pos=config.pos_embed == "learn",
        use_rel_pos=config.use_rel_pos, window_size=config.window_size,
        global_attn_indexes=list(config.global_attn_indexes),
    )  # fmt: skip
    back = sam_config_to_vit(hf)
    fields = [k for k in config.to_dict() if k != "fc_norm"]  # None and False: no fc_norm before the tokens' mean
    wrong = [f"{k}={getattr(config, k)!r}" for k in fields if getattr(config, k) != getattr(back, k)]
    wrong += [f"fc_norm={config.fc_norm!r}"] if config.use_fc_norm != back.use_fc_norm else []
    if wrong:
        raise WeightError(f"the Hugging Face {MODEL_TYPE} layout cannot hold {', '.join(wrong)}")
    return hf


def _rename(key: str, back: bool = False) -> str | None:
    """A canonical key under SAM's names (``back``: the other way); None where it has no place."""
    if back:
        key = key.removeprefix(_PREFIX) if key.startswith(_PREFIX) else ""
        key = re.sub(r"^layers\.", "blocks.", key).replace("patch_embed.projection", "patch_embed.proj")
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias|rel_pos_h|rel_pos_w)", key)
    if m:
        table = {v: k for k, v in _PARTS.items()} if back else _PARTS
        part = table.get(m[2], m[2])
        known = part in (set(table.values()) | {"attn.qkv", "attn.proj", "attn"})
        if not known:
            return None
        return f"blocks.{m[1]}.{part}.{m[3]}" if back else f"{_PREFIX}layers.{m[1]}.{part}.{m[3]}"
    if key in ("pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"):
        return key if back else _PREFIX + key.replace("patch_embed.proj", "patch_embed.projection")
    return None


def to_sam(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    vit_config_to_sam(config)  # refuses what the layout cannot hold
    grid = (1, *config.grid_size, -1)
    return renamed(state, MODEL_TYPE, _rename, lambda k, v: np.asarray(v).reshape(grid) if k == "pos_embed" else v)


def from_sam(state: Mapping[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """The canonical state of the encoder's tensors, strictly: its neck and any other tensor with no
    canonical place named."""
    refuse_after_tower(
        state,
        f"{_PREFIX}neck.",
        "neck (two convolutions and their channel norms)",
        MODEL_TYPE,
        "model.vision_encoder.neck",
    )
    tokens = (1, -1, config.embed_dim)  # the table on the grid as the canonical tokens
    change = lambda k, v: np.asarray(v).reshape(tokens) if k == "pos_embed" else v  # noqa: E731
    out = renamed(state, MODEL_TYPE, lambda key: _rename(key, back=True), change, back=True)
    return strictly(out, config, MODEL_TYPE)
