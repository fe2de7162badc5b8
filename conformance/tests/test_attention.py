"""Attention on its own: explicit paths against each framework's fused kernel, masks, fully
masked rows, cross-attention with another context length and width, all against the oracle."""

import numpy as np
import pytest
from hypothesis import strategies as st

from conformance.numerics import error_model as E
from conformance import properties as P
from conformance import strategies as S
from conformance.builtin import FUSED, framework, qkv_arrays
from conformance.tests.helpers import attention, attention_model, attention_on_path, drawn
from weights import mha_shapes


def _close(port, what, model, name, actual, expected, pair=True):
    """Within the propagated bound of the attention's error model (twice it for two port outputs)."""
    P.check_close(
        port, what, actual, expected, model.spread(name), model.kind(name), pair=pair, mode="end-to-end", stage=name
    )


def _close_to_oracle(port, model, out, weights):
    _close(port, "output differs from the oracle", model, "attn", out, model.oracle["attn"], pair=False)
    if weights is not None:
        _close(
            port,
            "weights differ from the oracle",
            model,
            "attn.weights",
            weights,
            model.oracle["attn.weights"],
            pair=False,
        )


@drawn(None, case=S.attention_shapes(), data=st.data(), scale=st.sampled_from([0.3, 1.0, 3.0]))
def test_explicit_attention_equals_the_frameworks_fused_kernel(framework_port, case, data, scale):
    """Our explicit softmax(q k^T * scale + mask) v against F.scaled_dot_product_attention,
    mx.fast.scaled_dot_product_attention and jax.nn.dot_product_attention (no dead rows: there
    the kernels disagree with each other, see the fully-masked test)."""
    module, to_fw, to_np = framework(framework_port)
    mask = data.draw(st.one_of(st.none(), S.masks(case, allow_dead_rows=False)))
    q, k, v = qkv_arrays(case, scale)
    args = [to_fw(a) for a in (q, k, v)] + [None if mask is None else to_fw(mask)]
    sdpa, fused_kernel = module.scaled_dot_product_attention, FUSED[framework_port]
    if framework_port == "jax":  # compiled: op-by-op dispatch would compile every op per shape
        sdpa = module.jax.jit(sdpa, static_argnames=("scale", "fused"))
        fused_kernel = module.jax.jit(fused_kernel, static_argnums=(0, 5))
    explicit, weights = sdpa(*args, scale=case.head_dim**-0.5)
    fused = fused_kernel(module, *args, case.head_dim**-0.5)
    oracle, bound, oracle_w, bound_w = E.sdpa(q, k, v, mask, case.head_dim**-0.5)
    P.check_close(
        framework_port, "explicit vs fused kernel", to_np(explicit), to_np(fused), bound, "sdpa.out", pair=True
    )
    P.check_close(framework_port, "explicit vs oracle", to_np(explicit), oracle, bound, "sdpa.out")
    P.check_close(framework_port, "fused kernel vs oracle", to_np(fused), oracle, bound, "sdpa.out")
    P.check_close(framework_port, "weights vs oracle", to_np(weights), oracle_w, bound_w, "sdpa.weights")


@drawn(None, case=S.attention_shapes(), weights=S.weight_cases(S.SCALES[:4], offsets=False), data=st.data())
def test_multihead_attention_matches_oracle_with_and_without_mask(attention_path, case, weights, data):
    """Every built-in port's explicit and fused paths, and every given attention port."""
    mask = data.draw(st.one_of(st.none(), S.masks(case)))
    x, ctx = case.inputs()
    ctx = None if (case.kv_len, case.context_dim) == (case.q_len, case.dim) and data.draw(st.booleans()) else ctx
    out, attn = attention_on_path(attention_path, case, weights)(x, ctx, mask)
    model = attention_model(case, weights, x, ctx, mask)
    _close_to_oracle(attention_path, model, out, attn)


@drawn(None, case=S.attention_shapes(cross=True), weights=S.weight_cases(S.SCALES[:4], offsets=False))
def test_cross_attention_takes_context_of_another_length_and_width(attention_port, case, weights):
    x, ctx = case.inputs()
    out, attn = attention(attention_port, case, weights)(x, ctx)
    assert out.shape == (case.batch, case.q_len, case.dim)
    assert attn.shape == (case.batch, case.num_heads, case.q_len, case.kv_len)
    _close_to_oracle(attention_port, attention_model(case, weights, x, ctx), out, attn)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@drawn(None, case=S.attention_shapes(), weights=S.weight_cases(S.SCALES[:4], offsets=False), row=st.integers(0, 6))
def test_fully_masked_query_row_gives_zero_output_before_proj_and_zero_weights(
    attention_path, kind, case, weights, row
):
    """The documented behaviour of every port, built-in or given: a query that may attend to no
    key gets zero weights and a zero attention output, so after ``proj`` it equals proj's bias.
    (Left to themselves torch's kernel gives NaN there and MLX's the mean of the values.)"""
    row = row % case.q_len
    keep = np.ones((1, 1, case.q_len, case.kv_len), bool)
    keep[..., row, :] = False
    mask = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    x, ctx = case.inputs()
    state_out, attn = attention_on_path(attention_path, case, weights)(x, ctx, mask)
    bias = weights.make_params(mha_shapes(case.dim, case.context_dim, case.num_heads, case.head_dim, case.qkv_bias))[
        "proj.bias"
    ]
    P.check_fully_masked_row(attention_path, state_out, attn, row, bias)
    _close_to_oracle(attention_path, attention_model(case, weights, x, ctx, mask), state_out, attn)


@drawn(None, case=S.attention_shapes(), weights=S.weight_cases(S.SCALES[:4], offsets=False), data=st.data())
def test_boolean_mask_equals_additive_zero_or_minus_inf_mask(attention_port, case, weights, data):
    keep = data.draw(S.masks(case, kind="bool"))
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    x, ctx = case.inputs()
    fwd = attention(attention_port, case, weights)
    out_b, w_b = fwd(x, ctx, keep)
    out_a, w_a = fwd(x, ctx, additive)
    model = attention_model(case, weights, x, ctx, keep)
    _close(attention_port, "boolean vs additive mask: output", model, "attn", out_b, out_a)
    _close(attention_port, "boolean vs additive mask: weights", model, "attn.weights", w_b, w_a)


@drawn(None, case=S.attention_shapes(cross=True), weights=S.weight_cases(S.SCALES[:4], offsets=False), data=st.data())
def test_masked_keys_do_not_influence_the_output(attention_port, case, weights, data):
    keep = data.draw(S.masks(case, kind="bool", allow_dead_rows=False))
    x, ctx = case.inputs()
    fwd = attention(attention_port, case, weights)
    out, attn = fwd(x, ctx, keep)
    assert np.all(attn[~np.broadcast_to(keep, attn.shape)] == 0.0)
    # The kept keys' weights are a softmax over the kept keys alone: they sum to 1.
    model = attention_model(case, weights, x, ctx, keep)
    sums = attn.sum(-1)
    P.check_close(
        attention_port,
        "weights over the kept keys do not sum to 1",
        sums,
        np.ones_like(sums),
        case.kv_len * model.spread("attn.weights"),
        model.kind("attn.weights"),
        mode="end-to-end",
        stage="attn.weights",
    )
    # Changing the context at a key masked for every query changes nothing.
    dead_keys = ~np.broadcast_to(keep, attn.shape).any(axis=(0, 1, 2))
    if dead_keys.any():
        ctx2 = ctx.copy()
        ctx2[:, dead_keys] += 10.0
        out2, _ = fwd(x, ctx2, keep)
        _close(attention_port, "a key masked for every query changed the output", model, "attn", out2, out)
