"""A standalone attention's bug classes (``ATTENTION_CLASSES``): ``attention(q, k, mask,
options)`` -> its weights, fitted where an attention port diverges (``fit.diagnose_attention``)."""

from __future__ import annotations


from collections.abc import Callable

import numpy as np

from impls import numpy_vit as O
from conformance.diagnosis.bugclass import BugClass
from conformance.diagnosis.model_classes import qk_logits

# ----------------------------------------------------------------------------- a standalone attention
# ``attention(q, k, mask, options)`` -> its weights (``AttentionModel``'s ``attn.weights``; ``attn``
# follows from them): fitted where an attention port diverges (``fit.diagnose_attention``).


def _mask_logits(logits, mask):
    if mask is None:
        return logits
    mask = np.asarray(mask)
    return np.where(mask, logits, -np.inf) if mask.dtype == np.bool_ else logits + mask


def _mha(logits: Callable, mask: Callable = lambda m: m, axis: int = -1, after=None):
    def weights(q, k, m, o):
        P = O.softmax(_mask_logits(logits(q, k, o), mask(m)), axis=axis)
        return P if after is None else after(P, m)

    return weights


def _scaled_qk(q, k, o):
    return (o.get("head_dim") or o["dim"] // o["num_heads"]) ** -0.5 * qk_logits(q, k)


def _inverted(m):
    return None if m is None or np.asarray(m).dtype != np.bool_ else ~np.asarray(m)


def _keep(P, m):
    if m is None:
        return P
    m = np.asarray(m)
    return P * (m if m.dtype == np.bool_ else m > -np.inf)


def _mha_causal(q, k, o):
    logits = _scaled_qk(q, k, o)
    n, k_ = logits.shape[-2:]
    return np.where(np.tril(np.ones((n, k_), bool)), logits, -np.inf)


def _mha_naive(q, k, m, o):
    logits = _mask_logits(_scaled_qk(q, k, o), m).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(logits)
        return (e / e.sum(-1, keepdims=True)).astype(np.float64)


_MHA = ("mha.weights", "mha.out")

# fmt: off
ATTENTION_CLASSES: tuple[BugClass, ...] = (
    BugClass("mask_ignored", _MHA, "the attention without its mask (never applied)",
             "apply the mask to the logits and use the result: logits = logits.masked_fill(~mask, -inf)",
             attention=_mha(_scaled_qk, mask=lambda m: None)),
    BugClass("mask_inverted", _MHA, "a boolean mask read as True = masked",
             "this API's boolean mask is True = keep (torch's F.scaled_dot_product_attention, mx.fast)",
             attention=_mha(_scaled_qk, mask=_inverted)),
    BugClass("mask_after_softmax", _MHA, "the mask multiplied into the weights after the softmax, not renormalised",
             "mask the logits before the softmax", attention=_mha(_scaled_qk, mask=lambda m: None, after=_keep)),
    BugClass("mha_causal_mask", _MHA, "a causal mask always applied", "an encoder's attention is not causal",
             attention=_mha(_mha_causal)),
    BugClass("mha_scale_by_dim", _MHA, "logits scaled by dim ** -0.5", "the scale is head_dim ** -0.5",
             attention=_mha(lambda q, k, o: o["dim"] ** -0.5 * qk_logits(q, k))),
    BugClass("mha_scale_missing", _MHA, "softmax(q kᵀ) without the scale", "scale the logits by head_dim ** -0.5",
             attention=_mha(lambda q, k, o: qk_logits(q, k))),
    BugClass("mha_softmax_over_queries", _MHA, "the softmax over queries (axis -2)", "softmax over keys: axis -1",
             attention=_mha(_scaled_qk, axis=-2)),
    BugClass("mha_softmax_without_max", _MHA, "the softmax as exp(l) / sum(exp(l)) in float32",
             "subtract the row maximum (torch.softmax, jax.nn.softmax do)", attention=_mha_naive),
)
# fmt: on
