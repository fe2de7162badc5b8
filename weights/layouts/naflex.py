"""timm's NaFlexVit state dict (timm/models/naflexvit.py): the patch embedding, its position
table and the prefix tokens under ``embeds``, the projection a Linear over each patch flattened
(ph, pw, C) (timm's ``batch_patchify``, channels last), the table a (1, Gh, Gw, D) grid. The
blocks, norms, pools and heads are VisionTransformer's, by the same names. Both ways are
reshapes and transposes: bitwise.

A bare NaFlexVit state dict's config is inferred from its shapes: in_chans 3 and square patches
(a Linear's width, ph * pw * C, does not tell them apart), the table's grid as
``pos_embed_grid_size``, images of any size (``dynamic_img_size``); the patch grid of the
checkpoint's own images is not in the shapes, so img_size defaults to the table's grid.
"""

from __future__ import annotations

import math

import numpy as np

from weights import files
from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.layouts._io import metadata, stored_config
from weights.layouts.timm import block_sizes

LAYOUT = "naflex"
# canonical name -> NaFlexVit's, for the entries that only move
_MOVED = {
    "patch_embed.proj.bias": "embeds.proj.bias",
    "patch_embed.norm.weight": "embeds.norm.weight",
    "patch_embed.norm.bias": "embeds.norm.bias",
    "cls_token": "embeds.cls_token",
    "reg_token": "embeds.reg_token",
}


def detect(path, header) -> bool:
    return header is not None and "embeds.proj.weight" in header[1]


def from_canonical(state: dict[str, np.ndarray], config: ViTConfig) -> dict[str, np.ndarray]:
    """The canonical state as NaFlexVit holds it."""
    out = {}
    for key, value in state.items():
        if key == "patch_embed.proj.weight":  # (D, C, ph, pw) -> (D, ph * pw * C)
            out["embeds.proj.weight"] = np.ascontiguousarray(value.transpose(0, 2, 3, 1)).reshape(value.shape[0], -1)
        elif key == "pos_embed":
            if not config.no_embed_class:
                raise WeightError("NaFlexVit's table covers the patches alone: the config needs no_embed_class=True")
            out["embeds.pos_embed"] = value.reshape(1, *config.pos_grid, value.shape[-1])
        else:
            out[_MOVED.get(key, key)] = value
    return out


def to_canonical(state: dict[str, np.ndarray], patch_size: tuple[int, int], in_chans: int) -> dict[str, np.ndarray]:
    """NaFlexVit's state in the canonical names and layouts (shapes checked by the caller's strict load)."""
    back = {v: k for k, v in _MOVED.items()}
    (ph, pw), C = patch_size, in_chans
    out = {}
    for key, value in state.items():
        if key == "embeds.proj.weight":
            if value.ndim != 2 or value.shape[1] != ph * pw * C:
                raise WeightError(
                    f"embeds.proj.weight has shape {tuple(value.shape)}: expected (embed_dim, {ph * pw * C}), "
                    f"a patch of {ph}x{pw} pixels of {C} channels flattened (ph, pw, C)"
                )
            out["patch_embed.proj.weight"] = np.ascontiguousarray(
                value.reshape(value.shape[0], ph, pw, C).transpose(0, 3, 1, 2)
            )
        elif key == "embeds.pos_embed":
            if value.ndim != 4:
                raise WeightError(f"embeds.pos_embed has shape {tuple(value.shape)}: expected (1, Gh, Gw, embed_dim)")
            out["pos_embed"] = value.reshape(1, -1, value.shape[-1])
        else:
            out[back.get(key, key)] = value
    return out


def infer_config(state: dict[str, np.ndarray], num_heads: int | None = None, img_size=None) -> ViTConfig:
    """A config from a NaFlexVit state dict's shapes (the module docstring says what it assumes)."""
    try:
        D, width = state["embeds.proj.weight"].shape
        grid = tuple(int(g) for g in state["embeds.pos_embed"].shape[1:3])
    except (KeyError, ValueError) as e:
        raise WeightError(f"not a NaFlexVit state dict: missing {e}") from None
    sizes = block_sizes(state, D, num_heads, "NaFlexVit")
    p = math.isqrt(width // 3)
    if 3 * p * p != width:
        raise WeightError(
            f"embeds.proj.weight reads {width} values a patch, not 3 channels of a square patch: pass a config"
        )
    class_token = "embeds.cls_token" in state
    pool = "map" if "attn_pool.latent" in state else "token" if class_token and "fc_norm.weight" not in state else "avg"
    return ViTConfig(
        img_size=img_size or (grid[0] * p, grid[1] * p),
        patch_size=p,
        global_pool=pool,
        class_token=class_token,
        **sizes,
        reg_tokens=state["embeds.reg_token"].shape[1] if "embeds.reg_token" in state else 0,
        no_embed_class=True,
        fc_norm=True if "fc_norm.weight" in state else None,
        init_values=1e-5 if "blocks.0.ls1.gamma" in state else None,
        dynamic_img_size=True,
        pos_embed_grid_size=grid,
    )


def read(path, config=None, num_heads=None, img_size=None, cast=False, **options):
    raw = files.read_timm(path)
    config = config or stored_config(path) or infer_config(raw, num_heads, img_size)
    state = to_canonical(files.stored_float32(raw, cast, path), config.patch_size, config.in_chans)
    return config, files.check(state, config, what=str(path))


def write(state, config, path, **options) -> None:
    from safetensors.numpy import save_file

    native = {k: np.ascontiguousarray(v) for k, v in from_canonical(state, config).items()}
    save_file(native, path, metadata=metadata(config, LAYOUT))
