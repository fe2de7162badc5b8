"""timm's state dict: a .safetensors, or a .pth/.pt/.bin written with tensors only (read with
``weights_only``); a bare one's config is inferred from its shapes (and --num-heads)."""

from __future__ import annotations

import numpy as np

from weights import formats
from weights.layouts._io import metadata, stored_config

SUFFIXES = (".pth", ".pt", ".bin")


def detect(path, header) -> bool:
    if header is None:
        return str(path).endswith(SUFFIXES)
    return "patch_embed.proj.weight" in header[1]


def detect_never(path, header) -> bool:
    return False


def read(path, config=None, num_heads=None, img_size=None, **options):
    state = formats.read_timm(path)
    config = config or stored_config(path) or formats.infer_timm_config(state, num_heads=num_heads, img_size=img_size)
    return config, formats.check(state, config, what=str(path), cast=options.get("cast", False))


def write(state, config, path, **options) -> None:
    if str(path).endswith(SUFFIXES):
        import torch

        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, path)
        return
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path, metadata=metadata(config))
