"""timm's state dict: a .safetensors, or a .pth/.pt/.bin written with tensors only (read with
``weights_only``); a bare one's config is inferred from its shapes (and --num-heads)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from weights.canonical import WeightError
from weights.config import ViTConfig
from weights.files import check, read_timm
from weights.layouts._io import metadata, stored_config

SUFFIXES = (".pth", ".pt", ".bin")


def block_sizes(state: Mapping[str, np.ndarray], D: int, num_heads: int | None, what: str) -> dict:
    """What a timm state dict's blocks and head show, for a model of width ``D``: the depth, the
    MLP's ratio, the q, k and v biases, the classes; heads are not in the shapes, ``num_heads``
    defaults to timm's convention for its presets, embed_dim // 64. ``what``: the layout, for the error."""
    try:
        depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
        hidden = state["blocks.0.mlp.fc1.weight"].shape[0]
    except (KeyError, ValueError) as e:
        raise WeightError(f"not a {what} state dict: missing {e}") from None
    return {
        "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
        "embed_dim": D,
        "depth": depth,
        "num_heads": num_heads or max(1, D // 64),
        "mlp_ratio": hidden / D,
        "qkv_bias": "blocks.0.attn.qkv.bias" in state,
    }


def infer_timm_config(
    state: Mapping[str, np.ndarray], num_heads: int | None = None, img_size=None, norm_eps: float = 1e-6
) -> ViTConfig:
    """A ViTConfig from a timm state dict's shapes (``block_sizes``)."""
    try:
        D, C, ph, pw = state["patch_embed.proj.weight"].shape
        n_pos = state["pos_embed"].shape[1]
    except (KeyError, ValueError) as e:
        raise WeightError(f"not a timm ViT state dict: missing {e}") from None
    sizes = block_sizes(state, D, num_heads, "timm ViT")
    class_token = "cls_token" in state
    n_patches = n_pos - (1 if class_token else 0)
    if img_size is None:
        side = int(round(n_patches**0.5))
        if side * side != n_patches:
            raise WeightError(f"pos_embed has {n_patches} patch positions, not a square grid: pass img_size")
        img_size = (side * ph, side * pw)
    pool = "avg" if "fc_norm.weight" in state else "token"
    return ViTConfig(
        img_size=img_size,
        patch_size=(ph, pw),
        in_chans=C,
        global_pool=pool,
        class_token=class_token,
        norm_eps=norm_eps,
        **sizes,
    )


# ----------------------------------------------------------------------------- big_vision / original ViT


def detect(path, header) -> bool:
    if header is None:
        return str(path).endswith(SUFFIXES)
    return "patch_embed.proj.weight" in header[1]


def detect_never(path, header) -> bool:
    return False


def read(path, config=None, num_heads=None, img_size=None, **options):
    state = read_timm(path)
    config = config or stored_config(path) or infer_timm_config(state, num_heads=num_heads, img_size=img_size)
    return config, check(state, config, what=str(path), cast=options.get("cast", False))


def write(state, config, path, **options) -> None:
    if str(path).endswith(SUFFIXES):
        import torch

        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, path)
        return
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path, metadata=metadata(config))
