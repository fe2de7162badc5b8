"""The position schemes as timm defines them (timm/layers/pos_embed.py, pos_embed_sincos.py), in
NumPy at float64: the oracle's. impls/torch_pos_embed.py, mlx_pos_embed.py and jax_pos_embed.py
compute the same in float32, op for op as timm does; a diff between them shows only framework
differences. The learned table is resampled to the images' grid (``resample_pos_embed``: timm's
``resample_abs_pos_embed``, antialiased); ``sinusoid_1d_pos_embed`` and ``sincos_2d_pos_embed``
are the fixed tables; and the rotary embeddings:

Four kinds (timm's ``rope_type``, and Pixtral's), each a table of angles (N, head_dim / 2) for the grid's N
patch tokens, row-major:

- ``cat``: EVA02 and the axial rope ViTs (``RotaryEmbeddingCat``): integer coordinates (plus
  ``offset``, rescaled onto ``ref_feat_shape`` where given) times head_dim / 4 bands
  ``temperature ** -(i / (head_dim / 4))``, the first axis's bands, then the second's;
- ``dinov3``: DINOv3 (``RotaryEmbeddingDinoV3``): 0.5-centred coordinates divided by the axis's
  size, mapped to [-1, 1], times ``2 pi / period``, periods
  ``temperature ** (2 i / (head_dim / 2))``;
- ``mixed``: RoPE-Mixed (``RotaryEmbeddingMixed``): learned frequencies ``freqs`` (2, depth,
  heads, head_dim / 2), ``x freqs[0] + y freqs[1]`` per block and head;
- ``pixtral``: Pixtral's (transformers' ``PixtralVisionRotaryEmbedding``, mlx-vlm's): one set of
  head_dim / 2 bands ``temperature ** -(2 j / head_dim)``, the even ones the row's, the odd ones
  the column's, integer coordinates; laid out as halves (``rotate_half``).

``indexing`` "ij" takes the coordinates as (row, column), "xy" as (column, row). The rotation
reads sin and cos laid out interleaved ([f0, f0, f1, f1, ...]: pairs (x0, x1), (x2, x3) rotate)
or, with ``rotate_half``, as halves ([f0, f1, ..., f0, f1, ...]: x_i rotates with x_{i + hd/2}).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from weights.resample import aa_matrix
from impls import pos_embed_schemes as schemes
from impls.rope_settings import rope_settings

KINDS = ("cat", "dinov3", "mixed", "pixtral")


def rope_grid(feat_shape, kind: str, offset: float = 0.0, indexing: str = "ij", ref_feat_shape=None):
    """(N, 2) coordinates of the grid's patches, row-major, in ``indexing``'s order."""
    shape = list(feat_shape)
    ref = None if ref_feat_shape is None else list(ref_feat_shape)
    if indexing == "xy":
        shape, ref = shape[::-1], None if ref is None else ref[::-1]
    if kind == "dinov3":  # centred, each axis by its own size
        t = [(np.arange(0.5, s) + offset) / s for s in shape]
    else:
        t = [np.arange(s, dtype=np.float64) + offset for s in shape]
    if ref is not None:  # EVA's fine-tuning rescale onto the pretraining grid
        t = [x / f * r for x, f, r in zip(t, shape, ref)]
    grid = np.stack(np.meshgrid(*t, indexing=indexing), axis=-1)
    if kind == "dinov3":
        grid = 2.0 * grid - 1.0
    return grid.reshape(-1, 2)


def rope_bands(head_dim: int, kind: str, temperature: float) -> np.ndarray:
    """(head_dim / 4,) angular frequencies per coordinate unit; (2, head_dim / 4) for ``pixtral``,
    each axis its own."""
    n = head_dim // 4
    if kind == "pixtral":  # one set over the head's pairs: the even bands the first axis's, the odd the second's
        bands = 1.0 / temperature ** (np.arange(0, head_dim, 2) / head_dim)
        return np.stack([bands[0::2], bands[1::2]])
    if kind == "dinov3":
        return 2 * np.pi / temperature ** (2.0 * np.arange(n) / (head_dim // 2))
    return 1.0 / temperature ** (np.arange(n) / n)


def rope_angles(
    feat_shape,
    head_dim: int,
    kind: str = "cat",
    temperature: float = 10000.0,
    offset=0.0,
    indexing: str = "ij",
    ref_feat_shape=None,
    freqs=None,
) -> np.ndarray:
    """The angles: (N, head_dim / 2) for ``cat`` and ``dinov3``; (depth, heads, N, head_dim / 2)
    for ``mixed``, from its learned ``freqs`` (2, depth, heads, head_dim / 2)."""
    if kind not in KINDS:
        raise ValueError(f"rope kind {kind!r}: expected one of {KINDS}")
    if kind == "mixed":
        grid = rope_grid(feat_shape, "cat", 0.0, indexing)
        return grid[:, 0, None] * freqs[0][..., None, :] + grid[:, 1, None] * freqs[1][..., None, :]
    grid = rope_grid(feat_shape, kind, offset, indexing, ref_feat_shape)
    return (grid[:, :, None] * rope_bands(head_dim, kind, temperature)).reshape(len(grid), -1)


def rope_layout(x: np.ndarray, rotate_half: bool = False) -> np.ndarray:
    """Per-frequency values (..., hd / 2) laid out as the rotation reads them (..., hd)."""
    # repeat's axis counted from the front: autograd's VJP of np.repeat reads a negative axis wrong
    # (the oracle's gradient through RoPE-Mixed's learned frequencies)
    return np.concatenate([x, x], axis=-1) if rotate_half else np.repeat(x, 2, axis=np.ndim(x) - 1)


def rope_embed(angles: np.ndarray, rotate_half: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """sin and cos of the angles, laid out for ``apply_rope``."""
    return rope_layout(np.sin(angles), rotate_half), rope_layout(np.cos(angles), rotate_half)


def rotate(x: np.ndarray, rotate_half: bool = False) -> np.ndarray:
    """x turned a quarter in each pair: interleaved (x0, x1) -> (-x1, x0), or halves."""
    if rotate_half:
        x1, x2 = np.split(x, 2, axis=-1)
        return np.concatenate([-x2, x1], axis=-1)
    return np.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)


def apply_rope(x: np.ndarray, sin: np.ndarray, cos: np.ndarray, rotate_half: bool = False) -> np.ndarray:
    """Each pair of x's features rotated by its angle: x cos + rotate(x) sin."""
    return x * cos + rotate(x, rotate_half) * sin


def config_angles(config, grid, freqs=None):
    """``rope_angles`` of ``config``'s rotary embedding at ``grid`` (rows, columns); RoPE-Mixed's
    from its learned ``freqs`` (the canonical ``rope.freqs``)."""
    return rope_angles(grid, **rope_settings(config), freqs=freqs)


def rope_tables(config, grid, freqs=None) -> tuple[np.ndarray, np.ndarray] | None:
    """sin and cos (P, head_dim) of ``config``'s rotary embedding at ``grid`` (rows, columns), or
    None without one: computed at the images' grid, as timm's Eva does; RoPE-Mixed's (depth, heads,
    P, head_dim), from its ``freqs`` (``block_rope`` takes a block's)."""
    if config.rope_type is None:
        return None
    return rope_embed(config_angles(config, grid, freqs), config.rope_rotate_half)


def rotate_tokens(x: np.ndarray, rope, num_prefix_tokens: int, rotate_half: bool = False) -> np.ndarray:
    """(B, H, N, hd): the patch tokens turned by their positions, the prefix tokens (class,
    registers) as they are (timm's EvaAttention)."""
    sin, cos = rope
    n = num_prefix_tokens
    return np.concatenate([x[..., :n, :], apply_rope(x[..., n:, :], sin, cos, rotate_half)], axis=-2)


def resample_pos_embed(pos, old_grid, new_grid, num_prefix_tokens: int, mode: str = "bicubic"):
    """timm's resample_abs_pos_embed for dynamic_img_size: the prefix entries kept, the grid
    resized with antialiasing, bicubically unless ``mode`` (one matrix per axis, weights/resample.py)."""
    if tuple(new_grid) == tuple(old_grid):
        return pos
    prefix, grid = pos[:, :num_prefix_tokens], pos[:, num_prefix_tokens:]
    grid = grid.reshape(grid.shape[0], *old_grid, grid.shape[-1])
    Rh, Rw = (aa_matrix(o, n, mode) for o, n in zip(old_grid, new_grid))
    grid = np.einsum("ih,bhwd,jw->bijd", Rh, grid, Rw)
    return np.concatenate([prefix, grid.reshape(grid.shape[0], -1, grid.shape[-1])], axis=1)


def sinusoid_1d_angles(n: int, dim: int):
    """The angles of the Transformer paper's 1-D table: position p times w_i = 10000 ** (-2i / dim),
    each for its sin and its cos, interleaved."""
    omega = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    return np.repeat(np.arange(n).reshape(-1, 1) * omega, 2, axis=1)


def sinusoid_1d_pos_embed(n: int, dim: int):
    """(1, n, dim), the Transformer paper's: PE(p, 2i) = sin(p w_i), PE(p, 2i + 1) = cos(p w_i)."""
    a = sinusoid_1d_angles(n, dim)
    return np.stack([np.sin(a[:, 0::2]), np.cos(a[:, 1::2])], axis=-1).reshape(1, n, dim)


def sincos_2d_angles(grid, dim: int, temperature: float = 10000.0):
    """The angles of the fixed 2-D sin-cos table (lucidrains' SimpleViT): for the patch at row y,
    column x and w_i = temperature ** (-i / (dim / 4 - 1)), i < dim / 4, [x w, x w, y w, y w]."""
    n = np.arange(grid[0] * grid[1]).reshape(-1, 1)  # the patches, row-major over the grid
    omega = 1.0 / temperature ** (np.arange(dim // 4) / (dim // 4 - 1))
    x, y = (n % grid[1]) * omega, (n // grid[1]) * omega
    return np.concatenate([x, x, y, y], axis=1)


def sincos_2d_pos_embed(grid, dim: int, temperature: float = 10000.0):
    """(1, gh * gw, dim): [sin x w, cos x w, sin y w, cos y w] (``sincos_2d_angles``)."""
    a = sincos_2d_angles(grid, dim, temperature)
    q = dim // 4
    return np.concatenate(
        [np.sin(a[:, :q]), np.cos(a[:, q : 2 * q]), np.sin(a[:, 2 * q : 3 * q]), np.cos(a[:, 3 * q :])], 1
    )[None]


# the fixed tables by config.pos_embed: whether each covers the prefix tokens too, and the table
# at (the tokens it covers, the images' grid, the width): the Transformer paper's over the sequence,
# SimpleViT's over the grid of patches
FIXED = {
    "sinusoid": (True, lambda n, grid, dim: sinusoid_1d_pos_embed(n, dim)),
    "sincos": (False, lambda n, grid, dim: sincos_2d_pos_embed(grid, dim)),
}

# the table the tokens get (config.pos_embed): the dispatch written once, bound to this framework's
pos_table = partial(schemes.pos_table, fixed=FIXED, resample=resample_pos_embed)


# the fixed tables' angles, each rounded once more by sin and cos (the error model's)
FIXED_ANGLES = {
    "sinusoid": lambda n, grid, dim: sinusoid_1d_angles(n, dim),
    "sincos": lambda n, grid, dim: sincos_2d_angles(grid, dim),
}
