"""Position-embedding resampling for another image size, as timm's resample_abs_pos_embed:
the prefix (class) token kept apart, the grid resized bicubically with antialiasing, in float32.
It changes only the canonical state, so every port can use the result."""

from __future__ import annotations

import numpy as np

from weights.config import ViTConfig
from weights.canonical import WeightError


def resample_abs_pos_embed(pos_embed: np.ndarray, new_size: tuple[int, int], old_size: tuple[int, int] | None = None,
                           num_prefix_tokens: int = 1, interpolation: str = "bicubic",
                           antialias: bool = True) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    _, n, dim = pos_embed.shape
    n_grid = n - num_prefix_tokens
    if old_size is None:
        side = int(round(n_grid ** 0.5))
        if side * side != n_grid:
            raise WeightError(f"pos_embed has {n_grid} grid positions, not a square: pass old_size")
        old_size = (side, side)
    if old_size[0] * old_size[1] != n_grid:
        raise WeightError(f"old_size {old_size} does not hold the {n_grid} grid positions of pos_embed")
    if tuple(new_size) == tuple(old_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    g = torch.from_numpy(np.ascontiguousarray(grid, np.float32)).reshape(1, *old_size, dim).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=tuple(new_size), mode=interpolation, antialias=antialias)
    g = g.permute(0, 2, 3, 1).reshape(1, -1, dim).numpy()
    return np.concatenate([prefix.astype(np.float32), g], axis=1)


def resample_state(state: dict[str, np.ndarray], config: ViTConfig, img_size) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """The config and state for running the same weights at ``img_size``."""
    new_config = config.replace(img_size=img_size)
    prefix = 0 if config.no_embed_class else config.num_prefix_tokens  # pytorch-image-models#1365
    pos = resample_abs_pos_embed(state["pos_embed"], new_config.grid_size, config.grid_size, prefix)
    return new_config, dict(state, pos_embed=pos)
