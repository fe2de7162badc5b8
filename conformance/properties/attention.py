"""A standalone attention's properties, on an attention factory."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.numerics.compare import error
from impls import numpy_vit as oracle_impl


from conformance.properties.core import (
    check_sums_to_one_over_keys,
    PropertyFailure,
    NotApplicable,
    ModelCase,
    AttentionCase,
    _fail,
    _call,
    within,
)


# ----------------------------------------------------------------------------- attention


def run_attention(
    port: str, make_attention: Callable, case: AttentionCase, x=None, context="same", mask=None, state=None
):
    forward = _call(port, lambda: make_attention(case.state if state is None else state, **case.options), case=case)
    ctx = case.context if isinstance(context, str) else context
    out, weights = _call(port, forward, case.x if x is None else x, ctx, mask, case=case)
    return np.asarray(out), (None if weights is None else np.asarray(weights))


def _oracle_attention(case: AttentionCase, x=None, context="same", mask=None):
    ctx = case.context if isinstance(context, str) else context
    return oracle_impl.make_attention(case.state, **case.options)(case.x if x is None else x, ctx, mask)


def check_cross_attention_weights_sum_to_one_over_keys(
    port: str, make_attention: Callable, case: AttentionCase
) -> None:
    """With Nq != Nk, weights (B, H, Nq, Nk) sum to 1 over keys; over queries they do not."""
    _, w = run_attention(port, make_attention, case)
    if w is None:
        raise NotApplicable("the port returns no attention weights")
    nq, nk = case.x.shape[1], (case.context if case.context is not None else case.x).shape[1]
    if w.shape[-2:] != (nq, nk):
        raise _fail(port, "attention weights have the wrong shape", case, shape=w.shape, expected=f"(B, H, {nq}, {nk})")
    bound = nk * case.error_model().spread("attn.weights")
    check_sums_to_one_over_keys(port, w, bound, "mha.weights", mode="end-to-end", case=case, stage="attn.weights")


def check_query_constant_changes_nothing(port: str, make_attention: Callable, case: AttentionCase, shift: np.ndarray):
    """Adding a constant to all logits of one query (an additive mask constant along keys)
    leaves the output unchanged: softmax is over keys."""
    nq = case.x.shape[1]
    nk = (case.context if case.context is not None else case.x).shape[1]
    bias = np.broadcast_to(shift.reshape(1, 1, nq, 1), (1, 1, nq, nk)).astype(np.float32)
    base, _ = run_attention(port, make_attention, case)
    moved, _ = run_attention(port, make_attention, case, mask=np.ascontiguousarray(bias))
    within(port, "adding a constant to a query's logits changed the output", case, "attn", moved, base)


def check_key_value_permutation_invariant(port: str, make_attention: Callable, case: AttentionCase, perm) -> None:
    """Permuting the context tokens (keys and values together) leaves the output unchanged."""
    ctx = case.context if case.context is not None else case.x
    base, _ = run_attention(port, make_attention, case, context=ctx)
    permuted, _ = run_attention(port, make_attention, case, context=np.ascontiguousarray(ctx[:, perm]))
    within(port, "permuting keys and values together changed the output", case, "attn", permuted, base)


def check_query_permutation_equivariant(port: str, make_attention: Callable, case: AttentionCase, perm) -> None:
    """Permuting the queries permutes the output the same way (cross-attention: the context stays)."""
    if case.context is None:
        raise NotApplicable("needs a separate context")
    base, _ = run_attention(port, make_attention, case)
    permuted, _ = run_attention(port, make_attention, case, x=np.ascontiguousarray(case.x[:, perm]))
    within(port, "permuting queries did not permute the output", case, "attn", permuted, base[:, perm])


def check_multihead_is_single_heads_concatenated(port: str, make_attention: Callable, case: AttentionCase) -> None:
    """With proj = identity, H-head attention equals H single-head attentions on the heads'
    slices of q, k and v, concatenated head-major."""
    o = case.options
    H, hd = o["num_heads"], o["head_dim"]
    inner = H * hd
    if o["dim"] != inner:
        raise NotApplicable("needs dim == num_heads * head_dim for an identity proj")
    state = dict(
        case.state, **{"proj.weight": np.eye(inner, dtype=np.float32), "proj.bias": np.zeros(inner, np.float32)}
    )
    out, _ = run_attention(port, make_attention, case, state=state)
    ctx = (case.context if case.context is not None else case.x).astype(np.float64)
    x = case.x.astype(np.float64)
    q = x @ state["q.weight"].T.astype(np.float64) + state.get("q.bias", 0)
    kv = ctx @ state["kv.weight"].T.astype(np.float64) + state.get("kv.bias", 0)
    heads = []
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        k, v = kv[..., :inner][..., sl], kv[..., inner:][..., sl]
        heads.append(oracle_impl.scaled_dot_product_attention(q[..., sl], k, v)[0])
    within(
        port,
        "multi-head attention is not its single heads concatenated head-major",
        case,
        "attn",
        out,
        np.concatenate(heads, axis=-1),
        case.error_model(state=state),
        pair=False,
    )


def check_large_logits_finite_and_match_oracle(port: str, make_attention: Callable, case: AttentionCase) -> None:
    """Inputs scaled until logits are in the hundreds: outputs stay finite and match the oracle."""
    big = AttentionCase(
        case.options, case.state, case.x * 30.0, None if case.context is None else case.context * 30.0, case.info
    )
    out, w = run_attention(port, make_attention, big)
    ref, ref_w = _oracle_attention(big)
    if not np.isfinite(out).all():
        raise _fail(port, "large logits gave non-finite outputs", big, non_finite=int((~np.isfinite(out)).sum()))
    within(port, "attention with large logits differs from the oracle", big, "attn", out, ref, pair=False)
    if w is not None:
        within(
            port,
            "attention weights with large logits differ from the oracle",
            big,
            "attn.weights",
            w,
            ref_w,
            pair=False,
        )


__all__ = [name for name in dir() if name.startswith(("check_", "run_"))] + [
    "AttentionCase",
    "ModelCase",
    "NotApplicable",
    "PropertyFailure",
    "error",
]
