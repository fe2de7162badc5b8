"""The error model of a LayerNorm (the mean against the spread) and of an RmsNorm: the float64 value
and the unit bound."""

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


def rms_norm(x, weight, bias, eps, p: Precision, dx=None):
    """timm's RmsNorm, x / sqrt(mean(x^2) + eps) * weight (``bias`` unused: it has none). The mean
    of squares sums D terms of one sign: no cancellation, its rounding about sqrt(D) u relative (as
    LayerNorm's variance), then x times the scale and the weight, two roundings; an input error
    dx moves y_i by w_i r (dx_i - xh_i <xh, dx> / D)."""
    D = x.shape[-1]
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xh = x * r
    y = xh * weight
    if not p.bounds:
        return y, 0.0
    g = np.abs(weight)
    bound = p.compute * (math.sqrt(D) + 2.0) * g * np.abs(xh) + p.storage * g * np.abs(xh) + p.output * np.abs(y)
    dx = p.inputs * np.abs(x) if dx is None else dx
    return y, bound + g * r * (dx + np.abs(xh) * np.sqrt((dx * dx).mean(-1, keepdims=True)))


def model_norm(config):
    """The error model of the model's norms (``config.norm_layer``)."""
    return rms_norm if config.norm_layer == "rmsnorm" else layer_norm
