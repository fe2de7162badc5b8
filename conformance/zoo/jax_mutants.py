"""JAX/Flax NNX mutants: bugs as they are written in JAX ports (JAX and Flax defaults,
big_vision conventions carried over to a timm checkpoint); the backward mutant at the end keeps
the forward and breaks the gradient (`verify --grad`)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from impls import jax_vit as J


class GELUTanh(J.GELU):
    """jax.nn.gelu's default is the tanh approximation; timm's is exact."""

    def __call__(self, x):
        return jax.nn.gelu(x)


class MlpTanhGELU(J.Mlp):
    def __init__(self, in_features, hidden_features, *args, rngs):
        super().__init__(in_features, hidden_features, *args, rngs=rngs)
        self.act = GELUTanh()


class AttentionMergeHeadDimFirst(J.Attention):
    """Heads merged as (head_dim, heads): transpose(0, 2, 3, 1) before the reshape."""

    def __call__(self, x, taps=None, name="attn"):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        for t, n in ((q, "q"), (k, "k"), (v, "v")):
            J.record_tap(taps, f"{name}.{n}", t)
        attn = jax.nn.softmax(J._matmul(q * self.scale, k.swapaxes(-2, -1)), axis=-1)
        J.record_tap(taps, f"{name}.weights", attn)
        x = J._matmul(attn, v).transpose(0, 2, 3, 1).reshape(B, N, C)
        x = self.proj(x)
        J.record_tap(taps, name, x)
        return x


class BlockFastVariance(J.Block):
    """Flax's LayerNorm default use_fast_variance=True: var = E[x^2] - E[x]^2, which cancels
    catastrophically in float32 when the mean is large against the spread."""

    def __init__(self, config, fused_attn=False, attn_layer=None, mlp_layer=None, index=0, *, rngs):
        super().__init__(config, fused_attn, attn_layer, mlp_layer, index, rngs=rngs)
        self.norm1 = nnx.LayerNorm(config.embed_dim, epsilon=config.norm_eps, rngs=rngs)
        self.norm2 = nnx.LayerNorm(config.embed_dim, epsilon=config.norm_eps, rngs=rngs)


class VisionTransformerClsWithoutPos(J.VisionTransformer):
    """big_vision adds the position embedding before prepending the class token, so the class
    token gets none; here a timm checkpoint is run that way, dropping pos_embed[:, 0]."""

    def _pos_embed(self, x, grid):
        x = x + self.pos_embed[...][:, 1:]
        cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[2]))
        return jnp.concatenate([cls, x], axis=1)


class AttentionNoQkvBias(J.Attention):
    """qkv built without its bias; the checkpoint's qkv.bias is dropped by a non-strict load."""

    def __init__(self, dim, num_heads, qkv_bias=True, fused_attn=False, *args, rngs, **kwargs):
        super().__init__(dim, num_heads, False, fused_attn, *args, rngs=rngs, **kwargs)


def qkv_bias_dropped(config, state, **kw):
    state = {k: v for k, v in state.items() if not k.endswith("attn.qkv.bias")}  # strict=False, in effect
    return J.make(config.replace(qkv_bias=False), state, **kw)


def cls_token_without_pos_embed(config, state, **kw):
    return J.make(config, state, model_cls=VisionTransformerClsWithoutPos, **kw)


gelu_tanh = partial(J.make, mlp_layer=MlpTanhGELU)
heads_merged_head_dim_first = partial(J.make, attn_layer=AttentionMergeHeadDimFirst)
layernorm_fast_variance = partial(J.make, block_fn=BlockFastVariance)


# ----------------------------------------------------------------------------- attention level


class MultiHeadAttentionMaskAfterSoftmax(J.MultiHeadAttention):
    """The mask multiplied into the weights after softmax, never renormalised."""

    def __call__(self, x, context=None, mask=None, return_weights=False):
        context = x if context is None else context
        B, N, _ = x.shape
        M = context.shape[1]
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)
        kv = self.kv(context).reshape(B, M, 2, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = jax.nn.softmax(J._matmul(q * self.scale, k.swapaxes(-2, -1)), axis=-1)
        if mask is not None:
            keep = mask if mask.dtype == jnp.bool_ else mask > -jnp.inf
            attn = attn * keep
        x = J._matmul(attn, v).transpose(0, 2, 1, 3).reshape(B, N, self.num_heads * self.head_dim)
        x = self.proj(x)
        return (x, attn) if return_weights else x


mask_after_softmax = partial(J.make_attention, model_cls=MultiHeadAttentionMaskAfterSoftmax)


# Backward mutants: the forward is the correct port's, the gradients are wrong (docs/gradients.md).
# --- attention whose softmax is a custom_vjp kernel with the backward P * g, without the
# row normaliser's term - P * sum(P * g); the forward is jax.nn.softmax, so the weights are exact.
@jax.custom_vjp
def _softmax_kernel(logits):
    return jax.nn.softmax(logits, axis=-1)


def _softmax_kernel_forward(logits):
    weights = jax.nn.softmax(logits, axis=-1)
    return weights, weights


def _softmax_kernel_backward(weights, grad):
    return (weights * grad,)


_softmax_kernel.defvjp(_softmax_kernel_forward, _softmax_kernel_backward)


class AttentionSoftmaxKernel(J.Attention):
    def __call__(self, x, taps=None, name="attn"):  # J.Attention's explicit path, the kernel's softmax
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = (J.record_tap(taps, f"{name}.{n}", t) for n, t in zip("qkv", qkv))
        attn = _softmax_kernel(J._matmul(q * self.scale, k.swapaxes(-2, -1)).astype(jax.numpy.float32))
        attn = J.record_tap(taps, f"{name}.weights", attn.astype(v.dtype))
        x = J.record_tap(taps, name, self.proj(J.merge_heads(J._matmul(attn, v))))
        return x


softmax_kernel_backward = partial(J.make_grad, attn_layer=AttentionSoftmaxKernel)
