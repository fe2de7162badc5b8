"""Position-embedding resampling for another image size, as timm's resample_abs_pos_embed:
the prefix (class) token kept apart, the grid resized bicubically with antialiasing, in float32.
``resample_state`` changes only the canonical state, so every port can use the result;
``aa_matrix`` is the same resampling along one axis as a matrix (bicubic or bilinear), which the MLX and JAX
ports and the oracle apply at run time for ``dynamic_img_size``."""

from __future__ import annotations

import numpy as np

from weights.config import ViTConfig
from weights.canonical import WeightError


def cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    # The antialiased kernel's cubic (PIL's, a = -0.5; the non-antialiased bicubic uses -0.75).
    x = np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1, np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def triangle(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


# mode -> (the kernel, its half-width at the input's scale): ATen's interp_size / 2
KERNELS = {"bicubic": (cubic, 2.0), "bilinear": (triangle, 1.0)}


def aa_matrix(n_in: int, n_out: int, mode: str = "bicubic", align_corners: bool = False) -> np.ndarray:
    """(n_out, n_in) float64: torch's interpolate(mode=mode, antialias=True, align_corners=...)
    along one axis (ATen's _upsample_{bicubic,bilinear}2d_aa weights: the kernel widened by the
    scale when downsampling, each row normalised; align_corners changes the scale alone, to
    (n_in - 1) / (n_out - 1), 0 for one output)."""
    kernel, half = KERNELS[mode]
    scale = ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0) if align_corners else n_in / n_out
    support = half * scale if scale >= 1.0 else half
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    R = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        w = kernel((np.arange(lo, hi) - center + 0.5) * invscale)
        R[i, lo:hi] = w / w.sum()
    return R


def resample_abs_pos_embed(
    pos_embed: np.ndarray,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    _, n, dim = pos_embed.shape
    n_grid = n - num_prefix_tokens
    if old_size is None:
        side = int(round(n_grid**0.5))
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


def resample_state(
    state: dict[str, np.ndarray], config: ViTConfig, img_size
) -> tuple[ViTConfig, dict[str, np.ndarray]]:
    """The config and state for running the same weights at ``img_size``."""
    new_config = config.replace(img_size=img_size)
    prefix = 0 if config.no_embed_class else config.num_prefix_tokens  # pytorch-image-models#1365
    if config.pos_embed_grid_size is not None:  # the table keeps its own grid (NaFlex): resampled at run time
        return new_config, state
    pos = resample_abs_pos_embed(state["pos_embed"], new_config.grid_size, config.grid_size, prefix)
    return new_config, dict(state, pos_embed=pos)
