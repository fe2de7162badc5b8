"""The error model of a rotary position embedding (timm's Eva): q or k of the patch tokens turned
by their positions, the prefix tokens as they are."""

from __future__ import annotations

import numpy as np

from conformance.numerics.roundings import Precision
from impls import numpy_pos_embed as R
from impls.protocol import ViTConfig

# The angle is a coordinate times a band: the band's power and division, the coordinate's offset,
# rescale or centring and the product round at most this many times, each by float32's u of the
# angle (measured against timm's own tables in tests/test_rope.py).
ANGLE_ROUNDINGS = 8


def rotary(x: np.ndarray, grid, config: ViTConfig, p: Precision, freqs=None):
    """(value, unit bound) of ``x`` (B, H, N, hd) rotated at ``grid`` (rows, columns); RoPE-Mixed's
    by its block's learned ``freqs`` (2, 1, H, hd / 2).

    A port computes the tables in float32 (timm does, whatever the model's dtype): sin and cos
    each within u (8 |angle| + 1) of the float64 oracle's, |angle| RoPE-Mixed's |x fx| + |y fy| (its
    sum may cancel), whose learned frequencies are weights the port holds in its dtype (each rounded:
    u_dtype |angle| more). It may store the tables in its dtype and multiply and add there (two
    products and their sum, each rounded), then emits the result in its output dtype. The prefix
    tokens pass unchanged: their output's rounding alone."""
    angles = R.config_angles(config, grid, freqs)
    reach = np.abs(angles) if freqs is None else R.config_angles(config, grid, np.abs(freqs))
    if freqs is not None:  # the block's (1, H, N, hd / 2): over its heads
        angles, reach = angles[0], reach[0]
    sin, cos = R.rope_embed(angles, config.rope_rotate_half)
    n = config.num_prefix_tokens
    prefix, xp = x[..., :n, :], x[..., n:, :]
    y = R.apply_rope(xp, sin, cos, config.rope_rotate_half)
    value = np.concatenate([prefix, y], axis=-2)
    if not p.bounds:
        return value, 0.0
    r = R.rotate(xp, config.rope_rotate_half)
    products = np.abs(xp * cos) + np.abs(r * sin)
    reach = R.rope_layout(reach, config.rope_rotate_half)
    table = p.compute * (ANGLE_ROUNDINGS * reach + 1.0)
    if freqs is not None:  # RoPE-Mixed's frequencies are weights: stored in the port's dtype, each rounded
        table = table + p.storage * reach
    bound = (np.abs(xp) + np.abs(r)) * table + p.storage * (2.0 * products + np.abs(y)) + p.output * np.abs(y)
    return value, np.concatenate([p.output * np.abs(prefix), bound], axis=-2)
