"""MLX mutants: bugs as they are written in MLX ports (the seed MLX ViT post, MLX defaults); the
backward mutant at the end keeps the forward and breaks the gradient (`verify --grad`)."""

from __future__ import annotations

from functools import partial

import mlx.core as mx  # noqa: E402, I001
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

from conformance.zoo.catalogue import REL_SUPPORTS, ROPE_SUPPORTS  # noqa: E402
from impls import mlx_vit as M  # first: it loads OpenBLAS before mlx.core
from weights import to_native, validate_state


class BlockSharedNorm(M.Block):
    """One LayerNorm before attention and before the MLP: the seed MLX post's bug."""

    def __call__(self, x, taps=None, name="blocks.0"):
        h = self.norm1(x)
        M.record_tap(taps, f"{name}.norm1", h)
        x = x + self.attn(h, taps, f"{name}.attn")
        h = self.norm1(x)
        M.record_tap(taps, f"{name}.norm2", h)
        x = x + self.mlp(h, taps, f"{name}.mlp")
        M.record_tap(taps, name, x)
        return x


class MlpWithDropout(M.Mlp):
    """The seed post's MLP keeps nn.Dropout(0.1) after GELU, and the model is never put in eval
    mode (MLX modules start in training mode)."""

    def __init__(self, in_features, hidden_features, *args):
        super().__init__(in_features, hidden_features, *args)
        self.drop = nn.Dropout(0.1)

    def __call__(self, x, taps=None, name="mlp"):
        x = self.drop(self.act(self.fc1(x)))
        M.record_tap(taps, f"{name}.act", x)
        x = self.fc2(x)
        M.record_tap(taps, name, x)
        return x


class MlpExtraNorm(M.Mlp):
    """The seed post's MLP: Linear, GELU, Dropout, LayerNorm(hidden), Linear. The extra norm
    has no weights in a timm checkpoint, so it keeps MLX's default init."""

    def __init__(self, in_features, hidden_features, *args):
        super().__init__(in_features, hidden_features, *args)
        self._extra_norm = nn.LayerNorm(hidden_features)  # "_": not a parameter MLX loads or lists

    def __call__(self, x, taps=None, name="mlp"):
        x = self.act(self.fc1(x))
        M.record_tap(taps, f"{name}.act", x)
        x = self.fc2(self._extra_norm(x))
        M.record_tap(taps, name, x)
        return x


class AttentionSoftmaxOverQueries(M.Attention):
    """mx.softmax(attn, axis=-2): normalised over queries instead of keys."""

    def __call__(self, x, taps=None, name="attn"):
        return _attend(self, x, taps, name, axis=-2, scale=self.scale)


class AttentionNoScale(M.Attention):
    """The 1/sqrt(head_dim) scale forgotten."""

    def __call__(self, x, taps=None, name="attn"):
        return _attend(self, x, taps, name, axis=-1, scale=1.0)


def _attend(self, x, taps, name, axis, scale):
    B, N, C = x.shape
    qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        M.record_tap(taps, f"{name}.{n}", t)
    attn = mx.softmax((q * scale) @ k.swapaxes(-2, -1), axis=axis)
    M.record_tap(taps, f"{name}.weights", attn)
    x = self.proj((attn @ v).transpose(0, 2, 1, 3).reshape(B, N, C))
    M.record_tap(taps, name, x)
    return x


def conv_kernel_hw_swapped(config, state, **kw):
    """The conv kernel converted OIHW -> OWHI (transpose(0, 3, 2, 1)) instead of OHWI: H and W
    of every patch swapped. Square patches load and compute the wrong thing; non-square ones
    do not even load."""

    validate_state(state, config)
    model = M.VisionTransformer(config)
    native = to_native(state, M.FRAMEWORK)
    native["patch_embed.proj.weight"] = np.ascontiguousarray(state["patch_embed.proj.weight"].transpose(0, 3, 2, 1))
    M.load_state_dict(model, native)
    model.eval()
    return _forward(model, config, **kw)


def _forward(model, config, taps=True, dtype="float32"):
    model.set_dtype(M.DTYPES[dtype])

    def forward(images):
        out = model(mx.array(np.asarray(images)), return_taps=taps)
        mx.eval(out)
        return {k: M._numpy(v) for k, v in out.items()} if taps else M._numpy(out)

    return forward


def dropout_left_active(config, state, **kw):

    validate_state(state, config)
    model = M.VisionTransformer(config, mlp_layer=MlpWithDropout)
    M.load_state_dict(model, to_native(state, M.FRAMEWORK))  # and no model.eval()
    return _forward(model, config, **kw)


shared_layernorm = partial(M.make, block_fn=BlockSharedNorm)
extra_layernorm_in_mlp = partial(M.make, mlp_layer=MlpExtraNorm)
softmax_over_queries = partial(M.make, attn_layer=AttentionSoftmaxOverQueries)
attention_scale_missing = partial(M.make, attn_layer=AttentionNoScale)


# ----------------------------------------------------------------------------- attention level


class MultiHeadAttentionMaskInverted(M.MultiHeadAttention):
    """A boolean mask read as True = masked (the other common convention)."""

    def __call__(self, x, context=None, mask=None, return_weights=False):
        mask = None if mask is None or mask.dtype != mx.bool_ else mx.logical_not(mask)
        return super().__call__(x, context, mask, return_weights)


mask_inverted = partial(M.make_attention, model_cls=MultiHeadAttentionMaskInverted)


class MultiHeadAttentionSoftmaxOverQueries(M.MultiHeadAttention):
    """mx.softmax(..., axis=-2) in a standalone attention: normalised over queries."""

    def __call__(self, x, context=None, mask=None, return_weights=False):
        context = x if context is None else context
        B, L, _ = context.shape
        q = M.split_heads(self.q(x), self.num_heads)
        kv = self.kv(context).reshape(B, L, 2, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ kv[0].swapaxes(-2, -1)
        if mask is not None:
            attn = mx.where(mask, attn, -mx.inf) if mask.dtype == mx.bool_ else attn + mask
        attn = mx.softmax(attn, axis=-2)
        x = self.proj(M.merge_heads(attn @ kv[1]))
        return (x, attn) if return_weights else x


mha_softmax_over_queries = partial(M.make_attention, model_cls=MultiHeadAttentionSoftmaxOverQueries)


def layerscale_not_loaded(config, state, **kw):
    """riccardomusmeci/mlx-image#26: the DINOv2 blocks had no LayerScale, so load_weights
    (strict=False) dropped every ls1.gamma / ls2.gamma and each residual branch ran unscaled."""
    state = {k: np.ones_like(v) if k.endswith(".gamma") else v for k, v in state.items()}
    return M.make(config, state, **kw)


layerscale_not_loaded.supports = {"init_values": (1e-5,), "reg_tokens": (0, 2), "no_embed_class": (False, True)}


class AttentionPoolLatentDefaultGELU(M.AttentionPoolLatent):
    """The MAP head built with its class's default activation (exact GELU), not the model's act_layer."""

    def __init__(self, dim, num_heads, mlp_ratio, act_layer, norm_eps, fused_attn=False):
        super().__init__(dim, num_heads, mlp_ratio, "gelu", norm_eps, fused_attn)


class VisionTransformerMapHeadDefaultGELU(M.VisionTransformer):
    def __init__(self, config, fused_attn=False, *args, **kwargs):
        super().__init__(config, fused_attn, *args, **kwargs)
        self.attn_pool = AttentionPoolLatentDefaultGELU(
            config.embed_dim, config.num_heads, config.mlp_ratio, config.act_layer, config.norm_eps, fused_attn
        )


def map_head_exact_gelu(config, state, **kw):
    return M.make(config, state, model_cls=VisionTransformerMapHeadDefaultGELU, **kw)


map_head_exact_gelu.supports = {"global_pool": "map", "act_layer": "gelu_tanh", "class_token": (False, True)}


# Backward mutants: the forward is the correct port's, the gradients are wrong (docs/gradients.md).
# --- the class token behind mx.stop_gradient (a frozen-token trick carried into fine-tuning).
class VisionTransformerClsStopGradient(M.VisionTransformer):
    def _pos_embed(self, x, grid):
        cls_token = self.cls_token
        self.cls_token = mx.stop_gradient(cls_token)
        try:
            return super()._pos_embed(x, grid)
        finally:
            self.cls_token = cls_token


cls_token_stop_gradient = partial(M.make_grad, model_cls=VisionTransformerClsStopGradient)


def rope_pairs_as_halves(config, state, **kw):
    """mlx.nn.RoPE's default (traditional=False: x_i turned with x_(i + hd/2)) for a model whose
    rotation pairs neighbours (timm's rope ViTs and EVA02)."""
    return M.make(config.replace(rope_rotate_half=not config.rope_rotate_half), state, **kw)


rope_pairs_as_halves.supports = ROPE_SUPPORTS | {"rope_type": ("cat",), "rope_rotate_half": (False,)}


class AttentionRelPosOneHead(M.Attention):
    """BEiT's table read as one head's: its first column for every head."""

    def _get_rel_pos_bias(self):
        bias = super()._get_rel_pos_bias()
        return mx.broadcast_to(bias[:, :1], bias.shape)


rel_pos_bias_one_head = partial(M.make, attn_layer=AttentionRelPosOneHead)
rel_pos_bias_one_head.supports = REL_SUPPORTS | {"num_heads": lambda heads: heads > 1}  # one head: no other
