"""The position schemes as timm defines them (timm/layers/pos_embed.py, pos_embed_sincos.py), in JAX
at float32, op for op as timm computes them: the learned table resampled to the images' grid, the
fixed sin-cos and sinusoid tables, and the rotary embeddings; impls/numpy_pos_embed.py says what
each function is."""

from __future__ import annotations

from functools import partial

import math

import jax.numpy as jnp

import jax

from weights.resample import aa_matrix
from impls import pos_embed_schemes as schemes
from impls.rope_settings import rope_settings

PRECISION = jax.lax.Precision.HIGHEST  # as the model's contractions (impls/jax_vit.py)

KINDS = ("cat", "dinov3", "mixed", "pixtral")


def rope_grid(feat_shape, kind: str, offset: float = 0.0, indexing: str = "ij", ref_feat_shape=None):
    """(N, 2) coordinates of the grid's patches, row-major, in ``indexing``'s order."""
    shape = list(feat_shape)
    ref = None if ref_feat_shape is None else list(ref_feat_shape)
    if indexing == "xy":
        shape, ref = shape[::-1], None if ref is None else ref[::-1]
    if kind == "dinov3":  # centred, each axis by its own size
        t = [(jnp.arange(0.5, s, dtype=jnp.float32) + offset) / float(s) for s in shape]
    else:
        t = [jnp.arange(s).astype(jnp.float32) + offset for s in shape]
    if ref is not None:  # EVA's fine-tuning rescale onto the pretraining grid
        t = [x / f * r for x, f, r in zip(t, shape, ref)]
    grid = jnp.stack(jnp.meshgrid(*t, indexing=indexing), axis=-1)
    if kind == "dinov3":
        grid = 2.0 * grid - 1.0
    return grid.reshape(-1, 2)


def rope_bands(head_dim: int, kind: str, temperature: float) -> jnp.ndarray:
    """(head_dim / 4,) frequencies (``cat``) or periods (``dinov3``), as timm holds them; (2, head_dim / 4)
    for ``pixtral``, each axis its own (as transformers' PixtralVisionRotaryEmbedding holds them)."""
    n = head_dim // 4
    if kind == "pixtral":  # one set over the head's pairs: the even bands the first axis's, the odd the second's
        bands = 1.0 / (float(temperature) ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
        return jnp.stack([bands[0::2], bands[1::2]])
    if kind == "dinov3":
        return float(temperature) ** (2.0 * jnp.arange(n, dtype=jnp.float32) / (head_dim // 2))
    return 1.0 / (float(temperature) ** (jnp.arange(n).astype(jnp.float32) / n))


def rope_angles(
    feat_shape,
    head_dim: int,
    kind: str = "cat",
    temperature: float = 10000.0,
    offset=0.0,
    indexing: str = "ij",
    ref_feat_shape=None,
    freqs=None,
) -> jnp.ndarray:
    """The angles: (N, head_dim / 2) for ``cat`` and ``dinov3``; (depth, heads, N, head_dim / 2)
    for ``mixed``, from its learned ``freqs`` (2, depth, heads, head_dim / 2)."""
    if kind not in KINDS:
        raise ValueError(f"rope kind {kind!r}: expected one of {KINDS}")
    if kind == "mixed":
        grid = rope_grid(feat_shape, "cat", 0.0, indexing)
        freqs = jnp.asarray(freqs, jnp.float32)
        return grid[:, 0, None] * jnp.expand_dims(freqs[0], -2) + grid[:, 1, None] * jnp.expand_dims(freqs[1], -2)
    grid = rope_grid(feat_shape, kind, offset, indexing, ref_feat_shape)
    bands = rope_bands(head_dim, kind, temperature)
    if kind == "dinov3":
        return (2 * math.pi * grid[:, :, None] / bands).reshape(grid.shape[0], -1)
    return (grid[:, :, None] * bands).reshape(grid.shape[0], -1)


def rope_layout(x: jnp.ndarray, rotate_half: bool = False) -> jnp.ndarray:
    """Per-frequency values (..., hd / 2) laid out as the rotation reads them (..., hd)."""
    return jnp.concatenate([x, x], axis=-1) if rotate_half else jnp.repeat(x, 2, axis=-1)


def rope_embed(angles: jnp.ndarray, rotate_half: bool = False) -> tuple[jnp.ndarray, jnp.ndarray]:
    """sin and cos of the angles, laid out for ``apply_rope``."""
    return rope_layout(jnp.sin(angles), rotate_half), rope_layout(jnp.cos(angles), rotate_half)


def rotate(x: jnp.ndarray, rotate_half: bool = False) -> jnp.ndarray:
    """x turned a quarter in each pair: interleaved (x0, x1) -> (-x1, x0), or halves."""
    if rotate_half:
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([-x2, x1], axis=-1)
    return jnp.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)


def apply_rope(x: jnp.ndarray, sin: jnp.ndarray, cos: jnp.ndarray, rotate_half: bool = False) -> jnp.ndarray:
    """Each pair of x's features rotated by its angle: x cos + rotate(x) sin, in x's dtype (the
    tables' float32 kept until the sum, as timm's ``apply_rot_embed``)."""
    return (x * cos + rotate(x, rotate_half) * sin).astype(x.dtype)


def config_angles(config, grid, freqs=None):
    """``rope_angles`` of ``config``'s rotary embedding at ``grid`` (rows, columns); RoPE-Mixed's
    from its learned ``freqs`` (the canonical ``rope.freqs``)."""
    return rope_angles(grid, **rope_settings(config), freqs=freqs)


def rope_tables(config, grid, freqs=None) -> tuple[jnp.ndarray, jnp.ndarray] | None:
    """sin and cos (P, head_dim) of ``config``'s rotary embedding at ``grid`` (rows, columns), or
    None without one: computed at the images' grid, as timm's Eva does; RoPE-Mixed's (depth, heads,
    P, head_dim), from its ``freqs`` (``block_rope`` takes a block's)."""
    if config.rope_type is None:
        return None
    return rope_embed(config_angles(config, grid, freqs), config.rope_rotate_half)


def rotate_tokens(x: jnp.ndarray, rope, num_prefix_tokens: int, rotate_half: bool = False) -> jnp.ndarray:
    """(B, H, N, hd): the patch tokens turned by their positions, the prefix tokens (class,
    registers) as they are (timm's EvaAttention)."""
    sin, cos = rope
    n = num_prefix_tokens
    return jnp.concatenate([x[..., :n, :], apply_rope(x[..., n:, :], sin, cos, rotate_half)], axis=-2)


def resample_pos_embed(pos, old_grid, new_grid, num_prefix_tokens: int, mode: str = "bicubic"):
    """timm's resample_abs_pos_embed for dynamic_img_size: the prefix entries kept, the grid
    resized with antialiasing, bicubically unless ``mode`` (one matrix per axis, weights/resample.py), in float32."""
    if tuple(new_grid) == tuple(old_grid):
        return pos
    prefix, grid = pos[:, :num_prefix_tokens], pos[:, num_prefix_tokens:]
    grid = grid.reshape(grid.shape[0], *old_grid, grid.shape[-1]).astype(jnp.float32)
    Rh, Rw = (jnp.asarray(aa_matrix(o, n, mode), jnp.float32) for o, n in zip(old_grid, new_grid))
    grid = jnp.einsum("ih,bhwd,jw->bijd", Rh, grid, Rw, precision=PRECISION).astype(pos.dtype)
    return jnp.concatenate([prefix, grid.reshape(grid.shape[0], -1, grid.shape[-1])], axis=1)


def sinusoid_1d_pos_embed(n: int, dim: int):
    """(1, n, dim) in float32, the Transformer paper's: PE(p, 2i) = sin(p w_i), PE(p, 2i + 1) =
    cos(p w_i), w_i = 10000 ** (-2i / dim)."""
    angles = jnp.arange(n).reshape(-1, 1) * (1.0 / 10000.0 ** (jnp.arange(0, dim, 2) / dim))
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(1, n, dim)


def sincos_2d_pos_embed(grid, dim: int, temperature: float = 10000.0):
    """(1, gh * gw, dim) in float32, as lucidrains' SimpleViT computes it: [sin x w, cos x w,
    sin y w, cos y w], w_i = temperature ** (-i / (dim / 4 - 1))."""
    n = jnp.arange(grid[0] * grid[1]).reshape(-1, 1)  # the patches, row-major over the grid
    omega = 1.0 / temperature ** (jnp.arange(dim // 4) / (dim // 4 - 1))
    x, y = (n % grid[1]) * omega, (n // grid[1]) * omega
    return jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)[None]


# the fixed tables by config.pos_embed: whether each covers the prefix tokens too, and the table
# at (the tokens it covers, the images' grid, the width): the Transformer paper's over the sequence,
# SimpleViT's over the grid of patches
FIXED = {
    "sinusoid": (True, lambda n, grid, dim: sinusoid_1d_pos_embed(n, dim)),
    "sincos": (False, lambda n, grid, dim: sincos_2d_pos_embed(grid, dim)),
}

# the table the tokens get (config.pos_embed): the dispatch written once, bound to this framework's
pos_table = partial(schemes.pos_table, fixed=FIXED, resample=resample_pos_embed)
