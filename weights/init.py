"""A seeded random initialiser with timm's distributions, made to expose porting bugs.

Deviations from timm's init, each so that a bug cannot hide behind a trivial value:
* every LayerNorm weight is 1 +/- U(0.25, 0.75) and every bias +/- U(0.05, 0.3), drawn
  per norm: with timm's ones/zeros a block that reuses one norm computes the same thing;
* every Linear bias is drawn N(0, 0.02) rather than zero, so a dropped qkv bias shows;
* the cls token is N(0, 0.02) rather than N(0, 1e-6), so cls-token handling shows;
* BEiT's relative position bias tables are N(0, 0.5) rather than zero (trained ones are of that
  order), so a misread index or a table shared by the heads shows in the logits.
``scale`` multiplies the spread of every weight matrix and embedding (not the norms): large
scales give large attention logits, the stress regime for softmax.
"""

from __future__ import annotations

import numpy as np

from weights.config import ViTConfig
from weights.canonical import expected_shapes
from weights.native import tensor_kind


def _trunc_normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    # timm's trunc_normal_(std, a=-2, b=2) cuts at +/-2 absolute: at std 0.02 that is 100 sigma,
    # so it only matters for large scales; resample the tails like torch does.
    x = rng.normal(0.0, std, size=shape)
    if x.size == 0 or max(x.max(), -x.min()) <= 2.0:  # the common case, without an array of |x|
        return x
    bad = np.abs(x) > 2.0
    while bad.any():
        x[bad] = rng.normal(0.0, std, size=int(bad.sum()))
        bad = np.abs(x) > 2.0
    return x


def init_params(shapes: dict[str, tuple[int, ...]], seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Draw every tensor of ``shapes`` (canonical names) from a seeded generator."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in shapes.items():
        kind = tensor_kind(key)
        if kind == "norm":
            sign = rng.choice([-1.0, 1.0], size=shape)
            if key.endswith(".weight"):
                value = 1.0 + sign * rng.uniform(0.25, 0.75, size=shape)
            else:
                value = sign * rng.uniform(0.05, 0.3, size=shape)
        elif kind == "conv":
            fan_in = int(np.prod(shape[1:]))  # PyTorch's default conv init, which timm keeps
            bound = scale / np.sqrt(fan_in)
            value = rng.uniform(-bound, bound, size=shape)
        elif kind == "dense" or key in ("pos_embed", "cls_token", "dist_token", "reg_token", "attn_pool.latent"):
            value = _trunc_normal(rng, shape, 0.02 * scale)
        elif key.endswith("relative_position_bias_table"):  # logits' offsets, of a trained BEiT's order
            value = rng.normal(0.0, 0.5, size=shape)
        elif key.endswith(("rel_pos_h", "rel_pos_w")):  # per offset, q's products with them logits' offsets
            value = rng.normal(0.0, 0.5, size=shape)
        elif key.endswith(".gamma"):  # LayerScale: per channel, away from its init value
            value = rng.uniform(0.2, 1.2, size=shape)
        else:  # biases
            value = rng.normal(0.0, 0.02, size=shape)
        state[key] = value.astype(np.float32)
    return state


def init_state(config: ViTConfig, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """A canonical float32 state for ``config``."""
    state = init_params(expected_shapes(config), seed=seed, scale=scale)
    if config.rope_type == "mixed":
        state["rope.freqs"] = rope_mixed_freqs(config, seed)
    return state


def rope_mixed_freqs(config: ViTConfig, seed: int = 0) -> np.ndarray:
    """RoPE-Mixed's frequencies as timm's init_random_2d_freqs draws them: per block and head the
    bands temperature ** -(4 i / head_dim), turned by a random angle, x's then y's (2, depth, heads,
    head_dim / 2). Not scaled: they are angles per patch, not a spread."""
    rng = np.random.default_rng([seed, 2])  # a stream of its own: the other tensors' draws unchanged
    hd = config.head_dim
    mag = 1.0 / config.rope_temperature ** (np.arange(0, hd, 4) / hd)
    turn = rng.uniform(0.0, 2 * np.pi, (config.depth, config.num_heads, 1))
    fx = np.concatenate([mag * np.cos(turn), mag * np.cos(turn + np.pi / 2)], axis=-1)
    fy = np.concatenate([mag * np.sin(turn), mag * np.sin(turn + np.pi / 2)], axis=-1)
    return np.stack([fx, fy]).astype(np.float32)
