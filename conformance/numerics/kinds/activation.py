"""The error model of an activation (GELU and its kin, the SwiGLU gate): value, slope and bound."""

from __future__ import annotations

import math
import numpy as np
from scipy.special import erf
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from conformance.numerics.roundings import Precision
from conformance.numerics.tape import NEARBY, LARGE_ACTIVATION, taped_step


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def activation(name: str, h, slope: bool = True):
    """(act(h), act'(h)) in float64 for timm's act_layer ``name`` (``slope=False``: (act(h), None))."""
    if name == "gelu":
        cdf = 0.5 * (1.0 + erf(h / math.sqrt(2.0)))
        return h * cdf, (cdf + h * np.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)) if slope else None
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (h + 0.044715 * h**3))
        d = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * h * h) if slope else None
        return 0.5 * h * (1.0 + t), d
    k = 1.702 if name == "quick_gelu" else 1.0  # silu: x sigmoid(x)
    sg = _sigmoid(k * h)
    return h * sg, (sg + k * h * sg * (1.0 - sg)) if slope else None


# |act''| <= this for every activation above (gelu's is 2 phi(0) = 0.80, quick_gelu's 0.85 at 0)
CURVATURE = 1.0


def _activation_near(name: str, h, entry, p: Precision):
    """(act(h), an upper bound of |act'(h)|) from a clean step's (h₀, act(h₀), act'(h₀), |act(h₀)|
    + |h₀|): where h is near h₀, the clean value plus its slope times d = h − h₀ (off by at most
    CURVATURE d²/2, kept below ``NEARBY`` of the rounding u_s (|a| + |h|) the bound allows there)
    and |act'(h₀)| + CURVATURE |d|; elsewhere act itself."""
    h0, a0, s0, size = entry
    d = np.subtract(h, h0)
    far = d * d > (2 * NEARBY * p.storage / CURVATURE) * size
    a = np.multiply(s0, d)
    a += a0
    slope = None
    if p.bounds:
        slope = np.abs(d, out=d)
        slope *= CURVATURE
        slope += np.abs(s0)
    if far.any():
        exact, exact_slope = activation(name, h[far], p.bounds)
        a[far] = exact
        if p.bounds:
            slope[far] = np.abs(exact_slope)
    return a, slope


def gelu(h, dh, p: Precision, name: str = "gelu"):
    """An activation of h (off by dh): its slope carries dh, and its curvature dh²/2 more (Taylor's
    remainder: nothing where dh is a rounding, but a dynamically quantized input's dh is a good
    part of a unit); the function itself is evaluated in the storage dtype by some frameworks
    (MLX's erf): absolute error u_s (|a| + |h|)."""
    record, entry = taped_step("acts") if h.size >= LARGE_ACTIVATION else (None, None)
    if entry is not None and entry[0].shape == h.shape:  # a run following the clean step's tape
        a, slope = _activation_near(name, h, entry, p)
    else:
        a, slope = activation(name, h, p.bounds or record is not None)
        if record is not None:
            record.append((h, a, slope, np.abs(a) + np.abs(h)))
    if not p.bounds:
        return a, 0.0
    return a, (np.abs(slope) + 0.5 * CURVATURE * dh) * dh + p.storage * (np.abs(a) + np.abs(h))


def gated(g, dg, v, dv, p: Precision, name: str):
    """SwiGLU's act(gate) * value, with the gate's and the value's errors carried."""
    a, da = gelu(g, dg, p, name)
    y = a * v
    if not p.bounds:
        return y, 0.0
    return y, da * np.abs(v) + np.abs(a) * dv + p.storage * np.abs(y)
