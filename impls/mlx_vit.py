"""The MLX port: a timm-style VisionTransformer in float32, in eval mode.

Parallel to numpy_vit.py (the spec), torch_vit.py and jax_vit.py: same classes, same order.
MLX convs take NHWC, so PatchEmbed transposes the NCHW input; its kernel is OHWI.
"""

from __future__ import annotations

from impls.mlx_blas import use_openblas

use_openblas()  # before mlx.core: MLX then binds cblas_sgemm to OpenBLAS (see impls/mlx_blas.py)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

from impls.config import ORIGINAL_VIT, ViTConfig, check_images, require_original_vit  # noqa: E402
from weights import check_exact_match, mha_shapes, to_native, validate_state  # noqa: E402

FRAMEWORK = "mlx"
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


# ----------------------------------------------------------------------------- functional

def _dead_rows(mask: mx.array) -> mx.array:
    """Query rows in which the mask leaves no key."""
    keep = mask if mask.dtype == mx.bool_ else mask > -mx.inf
    return mx.logical_not(mx.any(keep, axis=-1, keepdims=True))


def split_heads(x, num_heads: int):
    """(B, N, H * hd) -> (B, H, N, hd)."""
    B, N, _ = x.shape
    return x.reshape(B, N, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, hd) -> (B, N, H * hd), head-major: column h * hd + d, as timm's proj expects."""
    B, H, N, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, N, H * hd)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, fused=False):
    """softmax(q k^T * scale + mask) v over the key axis; returns (out, weights).

    ``mask`` broadcasts to (B, H, Nq, Nk): boolean keeps where True, float is added to the
    logits. A query row with every key masked gives zero weights and a zero output
    (mx.fast.scaled_dot_product_attention alone would average the values there).
    The fused path returns no weights.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if fused:
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        return (out if mask is None else mx.where(_dead_rows(mask), 0.0, out)), None
    attn = (q * scale) @ k.swapaxes(-2, -1)
    if mask is not None:
        attn = mx.where(mask, attn, -mx.inf) if mask.dtype == mx.bool_ else attn + mask
    attn = mx.softmax(attn, axis=-1, precise=True)  # in float32, as autocast keeps it
    if mask is not None:
        attn = mx.where(_dead_rows(mask), 0.0, attn)
    return attn @ v, attn


# ----------------------------------------------------------------------------- layers

Linear = nn.Linear
LayerNorm = nn.LayerNorm
GELU = nn.GELU  # exact (erf) by default
Conv2d = nn.Conv2d


def _tap(taps, name, value):
    if taps is not None:
        taps[name] = value


class PatchEmbed(nn.Module):
    """Non-overlapping p x p patches, each projected: a conv with stride = kernel = patch."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.grid_size = config.grid_size
        self.proj = Conv2d(config.in_chans, config.embed_dim, config.patch_size, stride=config.patch_size)

    def __call__(self, x):
        x = self.proj(x.transpose(0, 2, 3, 1))  # NCHW -> NHWC -> (B, gh, gw, D)
        return x.reshape(x.shape[0], -1, x.shape[-1])  # (B, gh * gw, D), row-major over the grid


class Attention(nn.Module):
    """timm's Attention: fused qkv with rows ordered (3, heads, head_dim)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, fused_attn: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = Linear(dim, dim)

    def __call__(self, x, taps=None, name="attn"):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        _tap(taps, f"{name}.q", q)
        _tap(taps, f"{name}.k", k)
        _tap(taps, f"{name}.v", v)
        if self.fused_attn and taps is None:
            x = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            q = q * self.scale
            attn = q @ k.swapaxes(-2, -1)
            attn = mx.softmax(attn, axis=-1, precise=True)  # over keys, in float32
            _tap(taps, f"{name}.weights", attn)
            x = attn @ v
        x = merge_heads(x)  # head-major
        x = self.proj(x)
        _tap(taps, name, x)
        return x


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention: queries from ``x``, keys and values from ``context``.

    Weights as timm's AttentionPoolLatent: ``q`` (H*hd, dim), ``kv`` (2*H*hd, context_dim)
    with rows ordered (2, heads, head_dim), ``proj`` (dim, H*hd).
    """

    def __init__(self, dim, context_dim=None, num_heads=8, head_dim=None, qkv_bias=True, fused_attn=False):
        super().__init__()
        context_dim = dim if context_dim is None else context_dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        inner = num_heads * self.head_dim
        self.q = Linear(dim, inner, bias=qkv_bias)
        self.kv = Linear(context_dim, inner * 2, bias=qkv_bias)
        self.proj = Linear(inner, dim)

    def __call__(self, x, context=None, mask=None, return_weights=False):
        context = x if context is None else context
        B, M, _ = context.shape
        q = split_heads(self.q(x), self.num_heads)
        kv = self.kv(context).reshape(B, M, 2, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        fused = self.fused_attn and not return_weights
        x, attn = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale, fused=fused)
        x = merge_heads(x)
        x = self.proj(x)
        return (x, attn) if return_weights else x


class Mlp(nn.Module):
    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.fc1 = Linear(in_features, hidden_features)
        self.act = GELU()
        self.fc2 = Linear(hidden_features, in_features)

    def __call__(self, x, taps=None, name="mlp"):
        x = self.act(self.fc1(x))
        _tap(taps, f"{name}.act", x)
        x = self.fc2(x)
        _tap(taps, name, x)
        return x


class Block(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x)); two distinct norms."""

    def __init__(self, config: ViTConfig, fused_attn: bool = False, attn_layer=None, mlp_layer=None):
        super().__init__()
        dim = config.embed_dim
        self.norm1 = LayerNorm(dim, eps=config.norm_eps)
        self.attn = (attn_layer or Attention)(dim, config.num_heads, qkv_bias=config.qkv_bias,
                                              fused_attn=fused_attn)
        self.norm2 = LayerNorm(dim, eps=config.norm_eps)
        self.mlp = (mlp_layer or Mlp)(dim, config.mlp_hidden_dim)

    def __call__(self, x, taps=None, name="blocks.0"):
        h = self.norm1(x)
        _tap(taps, f"{name}.norm1", h)
        x = x + self.attn(h, taps, f"{name}.attn")
        h = self.norm2(x)
        _tap(taps, f"{name}.norm2", h)
        x = x + self.mlp(h, taps, f"{name}.mlp")
        _tap(taps, name, x)
        return x


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig, fused_attn: bool = False, embed_layer=None, block_fn=None,
                 attn_layer=None, mlp_layer=None):
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.patch_embed = (embed_layer or PatchEmbed)(config)
        if config.class_token:
            self.cls_token = mx.zeros((1, 1, D))
        self.pos_embed = mx.zeros((1, config.num_tokens, D))
        self.blocks = [
            (block_fn or Block)(config, fused_attn, attn_layer, mlp_layer) for _ in range(config.depth)
        ]
        if config.use_fc_norm:
            self.fc_norm = LayerNorm(D, eps=config.norm_eps)
        else:
            self.norm = LayerNorm(D, eps=config.norm_eps)
        if config.num_classes:
            self.head = Linear(D, config.num_classes)

    def _pos_embed(self, x):
        if self.config.class_token:
            cls = mx.broadcast_to(self.cls_token, (x.shape[0], 1, x.shape[2]))
            x = mx.concatenate([cls, x], axis=1)
        return x + self.pos_embed  # the cls token gets its own position entry, as in timm

    def forward_features(self, x, taps=None):
        x = self.patch_embed(x)
        _tap(taps, "patch_embed", x)
        x = self._pos_embed(x)
        _tap(taps, "embed", x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, taps, f"blocks.{i}")
        if not self.config.use_fc_norm:
            x = self.norm(x)
            _tap(taps, "norm", x)
        return x

    def forward_head(self, x, taps=None):
        if self.config.global_pool == "avg":
            x = self.fc_norm(x[:, self.config.num_prefix_tokens:].astype(mx.float32).mean(axis=1).astype(x.dtype))
        else:
            x = x[:, 0]
        _tap(taps, "pooled", x)
        x = self.head(x) if self.config.num_classes else x
        _tap(taps, "logits", x)
        return x

    def __call__(self, x, return_taps: bool = False):
        check_images(tuple(x.shape), str(x.dtype), self.config)
        x = x.astype(self.pos_embed.dtype)  # float32 images in; the model runs in its weights' dtype
        taps = {} if return_taps else None
        x = self.forward_head(self.forward_features(x, taps), taps)
        return taps if return_taps else x


# ----------------------------------------------------------------------------- loading

def load_state_dict(model: nn.Module, native: dict[str, np.ndarray]) -> None:
    """Strict: our check names every bad key, then MLX's own strict path loads."""
    from mlx.utils import tree_flatten

    current = dict(tree_flatten(model.parameters()))
    check_exact_match({k: tuple(v.shape) for k, v in current.items()}, {k: np.shape(v) for k, v in native.items()})
    model.load_weights([(k, mx.array(np.asarray(v, dtype=np.float32))) for k, v in native.items()], strict=True)


def _numpy(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)  # NumPy has no bfloat16


def make(config: ViTConfig, state: dict[str, np.ndarray], *, taps: bool = True, fused_attn: bool = False,
         dtype: str = "float32", compiled: bool = False, model_cls=None, **layers):
    """Port factory: canonical float32 state -> forward(images) on NumPy arrays, computed in
    ``dtype`` (float32, bfloat16, float16; bfloat16 results come back as float32 arrays).

    ``model_cls`` and ``layers`` (embed_layer, block_fn, attn_layer, mlp_layer) swap in other
    module classes, as timm's VisionTransformer allows. ``compiled`` runs it through mx.compile.
    """
    require_original_vit(config, FRAMEWORK)
    validate_state(state, config)
    model = (model_cls or VisionTransformer)(config, fused_attn, **layers)
    load_state_dict(model, to_native(state, FRAMEWORK))
    model.set_dtype(DTYPES[dtype])
    model.eval()  # MLX modules start in training mode
    call = (lambda x: model(x, return_taps=taps))
    call = mx.compile(call) if compiled else call  # the weights are captured as constants

    def forward(images: np.ndarray):
        images = np.asarray(images)
        check_images(images.shape, str(images.dtype), config)  # mx.array() would cast float64 silently
        out = call(mx.array(images))
        mx.eval(out)
        return {k: _numpy(v) for k, v in out.items()} if taps else _numpy(out)

    return forward


make.supports = ORIGINAL_VIT  # conformance.support: verify and the plugin refuse the rest by name


def make_attention(state, *, dim, context_dim=None, num_heads, head_dim=None, qkv_bias=True, fused_attn=False,
                   model_cls=None):
    """Attention factory: canonical ``q``/``kv``/``proj`` state -> forward(x, context=None, mask=None)
    on NumPy arrays, returning (out, weights); weights are None on the fused path."""
    model = (model_cls or MultiHeadAttention)(dim, context_dim, num_heads, head_dim, qkv_bias, fused_attn=fused_attn)
    validate_state(state, expected=mha_shapes(dim, context_dim, num_heads, model.head_dim, qkv_bias))
    load_state_dict(model, to_native(state, FRAMEWORK))
    model.eval()

    def forward(x, context=None, mask=None):
        context = None if context is None else mx.array(context)
        mask = None if mask is None else mx.array(mask)
        out, attn = (model(mx.array(x), context, mask), None) if fused_attn else model(mx.array(x), context, mask, return_weights=True)
        mx.eval(out, attn)
        return np.array(out), None if attn is None else np.array(attn)

    return forward
