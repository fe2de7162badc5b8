"""The error model of attention: the softmax weights of scale q kᵀ (+ mask) and P v, with their
bounds, a few heads at a time where they are large."""

from __future__ import annotations

import math
import numpy as np
from impls import numpy_vit as O
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from impls.windows import rel_pos_index
from conformance.numerics.roundings import Precision

_HEADS_AT_ONCE = 1 << 23  # attention weights (elements) computed at once: a few heads of a large model


def _by_heads(fn, P_shape, *arrays):
    """``fn`` over chunks of the leading (batch, head) axes of ``arrays``, its (value, bound)
    written into whole arrays of ``P_shape``'s leading axes: every row is computed as whole (the
    softmax and its bound are per query row), and a full-size model's temporaries are a chunk's,
    not B·H·N² each (ViT-g/14 at 518: 45 M elements an image)."""
    lead = P_shape[:-2]
    rows = math.prod(lead)
    step = max(1, _HEADS_AT_ONCE // (P_shape[-2] * P_shape[-1]))
    flat = [np.broadcast_to(a, (*lead, *a.shape[-2:])).reshape(rows, *a.shape[-2:]) for a in arrays]
    value = bound = None
    for i in range(0, rows, step):
        v, b = fn(*(a[i : i + step] for a in flat))
        if value is None:
            value = np.empty((rows, *v.shape[1:]), v.dtype)
            bound = np.empty((rows, *v.shape[1:])) if np.ndim(b) else b
        value[i : i + step] = v
        if np.ndim(b):
            bound[i : i + step] = b
    shape = (*lead, *value.shape[1:])
    return value.reshape(shape), bound.reshape(shape) if np.ndim(bound) else bound


def _large_attention(P_shape, mask) -> bool:
    return mask is None and math.prod(P_shape) > _HEADS_AT_ONCE and len(P_shape) > 2


def softmax_weights(q, k, scale, p: Precision, mask=None):
    """softmax(scale q kᵀ + mask) over keys and its unit bound (a few heads at a time where the
    weights are large)."""
    P_shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    if _large_attention(P_shape, mask):
        return _by_heads(lambda q_, k_: _softmax_weights(q_, k_, scale, p), P_shape, q, k)
    return _softmax_weights(q, k, scale, p, mask)


def _softmax_weights(q, k, scale, p: Precision, mask=None):
    logits = scale * (q @ np.swapaxes(k, -2, -1))
    if mask is not None:
        mask = np.asarray(mask)
        logits = np.where(mask, logits, -np.inf) if mask.dtype == np.bool_ else logits + mask
    P = O.softmax(logits, axis=-1)
    if not p.bounds:
        return P, 0.0
    A = scale * np.sqrt((q * q) @ np.swapaxes(k * k, -2, -1))
    live = P > 0
    finite = np.where(np.isfinite(logits), logits, 0.0)
    m = np.max(np.where(live, finite, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    E = p.compute * (math.sqrt(q.shape[-1]) * A + np.abs(finite - m) + 1.0) + p.storage * (np.abs(finite) + A)
    E = np.where(live, E, 0.0)
    # A logit off by E_j moves its weight by a factor up to exp(E_j), and the normaliser by up to
    # exp(Ē) with Ē = log Σ_k P_k exp(E_k) (= Σ P E to first order): P expm1(E_j + Ē), at most 1.
    with np.errstate(divide="ignore"):
        shifted = np.where(live, E + np.log(np.where(live, P, 1.0)), -np.inf)
    top = np.max(shifted, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a fully masked row: no weight, no bound
        E_bar = top + np.log(np.sum(np.exp(shifted - top), axis=-1, keepdims=True))
    # past an exponent of 80, P e^(E + Ē) in log space: a bfloat16 logit of 3e4 is off by 117 (two
    # logits 120 apart round to one), and a weight of 4e-53 may be a correct port's 0.6
    growth = E + E_bar
    with np.errstate(divide="ignore"):
        far = np.exp(np.minimum(np.log(P) + np.maximum(growth, 80.0), 0.0))
    bound = np.where(growth > 80.0, far, np.minimum(P * np.expm1(np.minimum(growth, 80.0)), 1.0))
    return P, bound + p.output * P + p.tiny


def attend(P, dP, v, p: Precision):
    """P v over keys (B, H, Nq, hd) and its bound, with P's own error dP carried (a few heads at a
    time where P is large)."""
    if p.bounds and _large_attention(P.shape, None) and (dP is None or np.ndim(dP) >= 2):
        if dP is None:
            return _by_heads(lambda P_, v_: _attend(P_, None, v_, p), P.shape, P, v)
        return _by_heads(lambda P_, dP_, v_: _attend(P_, dP_, v_, p), P.shape, P, dP, v)
    return _attend(P, dP, v, p)


def _attend(P, dP, v, p: Precision):
    o = P @ v
    if not p.bounds:
        return o, 0.0
    m = np.sqrt((P * P) @ (v * v))
    do = p.compute * math.sqrt(v.shape[-2]) * m + p.storage * m + p.output * np.abs(o)
    if dP is not None:
        do = do + np.sqrt((dP * dP) @ (v * v))
    return o, do


def sdpa(q, k, v, mask=None, scale=None, precision: Precision | str = "float32"):
    """softmax(scale q kᵀ + mask) v from given q, k, v: (out, out bound, weights, weights bound)."""
    p = Precision(precision) if isinstance(precision, str) else precision
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    P, dP = softmax_weights(q, k, scale, p, mask)
    out, dout = attend(P, dP, v, p)
    return out, dout, P, dP


def decomposed_rel_pos(q, rel_pos_h, rel_pos_w, size, p: Precision):
    """SAM's bias q · rel_pos_h[dy] + q · rel_pos_w[dx] (impls/windows.py) and its unit bound: two
    contractions over head_dim, each rounded, then their sum rounded."""
    y = O.decomposed_rel_pos(q, rel_pos_h, rel_pos_w, size)
    if not p.bounds:
        return y, 0.0
    B, H, N, hd = q.shape
    qq = (q * q).reshape(B, H, *size, hd)
    (Rh, Rw) = (t[rel_pos_index(s)] for t, s in ((rel_pos_h, size[0]), (rel_pos_w, size[1])))
    m_h = np.sqrt(np.einsum("bnhwc,hkc->bnhwk", qq, Rh * Rh))[..., :, None]  # (B, H, S_h, S_w, S_h, 1)
    m_w = np.sqrt(np.einsum("bnhwc,wkc->bnhwk", qq, Rw * Rw))[..., None, :]
    r_q = q.reshape(B, H, *size, hd)
    rel = (
        np.abs(np.einsum("bnhwc,hkc->bnhwk", r_q, Rh))[..., :, None]
        + np.abs(np.einsum("bnhwc,wkc->bnhwk", r_q, Rw))[..., None, :]
    )
    bound = (p.compute * math.sqrt(hd) + p.storage) * (m_h + m_w) + p.output * rel
    return y, bound.reshape(B, H, N, N) + p.output * np.abs(y)
