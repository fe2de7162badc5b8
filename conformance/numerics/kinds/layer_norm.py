"""The error model of a LayerNorm: its float64 value and unit bound (the mean against the spread)."""

from __future__ import annotations

import math
import numpy as np
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from conformance.numerics.roundings import Precision


def layer_norm(x, weight, bias, eps, p: Precision, dx=None):
    D = x.shape[-1]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    sigma = np.sqrt(var + eps)
    xh = (x - mu) / sigma
    y = xh * weight + bias
    if not p.bounds:
        return y, 0.0
    rms = np.sqrt(mu * mu + var)
    g = np.abs(weight)
    bound = (
        p.compute * math.sqrt(D) * g * (rms / sigma + np.abs(xh))
        + p.storage * (g * np.abs(xh) + np.abs(bias))
        + p.output * np.abs(y)
    )
    # The input may be held more precisely than its tap shows (XLA keeps bf16 sums in float32
    # until they are stored), or is a sum the port does not tap: one rounding of it either way.
    dx = p.inputs * np.abs(x) if dx is None else dx
    bound = bound + g / sigma * (dx + np.sqrt((dx * dx).mean(-1, keepdims=True)))
    return y, bound
