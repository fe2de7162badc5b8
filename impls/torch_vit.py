"""The PyTorch port: a timm-style VisionTransformer in float32.

Parallel to numpy_vit.py (the spec), mlx_vit.py and jax_vit.py: same classes, same order.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from impls.config import ORIGINAL_VIT, ViTConfig, check_images, require_original_vit
from weights import check_exact_match, mha_shapes, to_native, validate_state

FRAMEWORK = "torch"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------- functional

def _dead_rows(mask: torch.Tensor) -> torch.Tensor:
    """Query rows in which the mask leaves no key."""
    keep = mask if mask.dtype == torch.bool else mask > -torch.inf
    return ~keep.any(dim=-1, keepdim=True)


def split_heads(x, num_heads: int):
    """(B, N, H * hd) -> (B, H, N, hd)."""
    B, N, _ = x.shape
    return x.reshape(B, N, num_heads, -1).transpose(1, 2)


def merge_heads(x):
    """(B, H, N, hd) -> (B, N, H * hd), head-major: column h * hd + d, as timm's proj expects."""
    B, H, N, hd = x.shape
    return x.transpose(1, 2).reshape(B, N, H * hd)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, fused=False):
    """softmax(q k^T * scale + mask) v over the key axis; returns (out, weights).

    ``mask`` broadcasts to (B, H, Nq, Nk): boolean keeps where True, float is added to the
    logits. A query row with every key masked gives zero weights and a zero output.
    The fused path returns no weights.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if fused:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return (out if mask is None else out.masked_fill(_dead_rows(mask), 0.0)), None
    attn = (q * scale) @ k.transpose(-2, -1)
    if mask is not None:
        attn = attn.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else attn + mask
    attn = attn.softmax(dim=-1, dtype=torch.float32).to(v.dtype)  # in float32, as autocast keeps it
    if mask is not None:
        attn = attn.masked_fill(_dead_rows(mask), 0.0)
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

    def forward(self, x):
        x = self.proj(x)  # (B, D, gh, gw)
        return x.flatten(2).transpose(1, 2)  # (B, gh * gw, D), row-major over the grid


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

    def forward(self, x, taps=None, name="attn"):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        _tap(taps, f"{name}.q", q)
        _tap(taps, f"{name}.k", k)
        _tap(taps, f"{name}.v", v)
        if self.fused_attn and taps is None:
            x = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1, dtype=torch.float32).to(v.dtype)  # over keys, in float32
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

    def forward(self, x, context=None, mask=None, return_weights=False):
        context = x if context is None else context
        B, M, _ = context.shape
        q = split_heads(self.q(x), self.num_heads)
        kv = self.kv(context).reshape(B, M, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
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

    def forward(self, x, taps=None, name="mlp"):
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

    def forward(self, x, taps=None, name="blocks.0"):
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
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_tokens, D))
        self.blocks = nn.ModuleList([
            (block_fn or Block)(config, fused_attn, attn_layer, mlp_layer) for _ in range(config.depth)
        ])
        if config.use_fc_norm:
            self.fc_norm = LayerNorm(D, eps=config.norm_eps)
        else:
            self.norm = LayerNorm(D, eps=config.norm_eps)
        if config.num_classes:
            self.head = Linear(D, config.num_classes)

    def _pos_embed(self, x):
        if self.config.class_token:
            cls = self.cls_token.expand(x.shape[0], -1, -1)
            x = torch.cat([cls, x], dim=1)
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
            x = self.fc_norm(x[:, self.config.num_prefix_tokens:].mean(dim=1, dtype=torch.float32).to(x.dtype))
        else:
            x = x[:, 0]
        _tap(taps, "pooled", x)
        x = self.head(x) if self.config.num_classes else x
        _tap(taps, "logits", x)
        return x

    def forward(self, x, return_taps: bool = False):
        check_images(tuple(x.shape), str(x.dtype), self.config)
        x = x.to(self.pos_embed.dtype)  # float32 images in; the model runs in its weights' dtype
        taps = {} if return_taps else None
        x = self.forward_head(self.forward_features(x, taps), taps)
        return taps if return_taps else x


# ----------------------------------------------------------------------------- loading

def load_state_dict(model: nn.Module, native: dict[str, np.ndarray]) -> None:
    """Strict: our check names every bad key, then torch's own strict path loads."""
    current = model.state_dict()
    check_exact_match({k: tuple(v.shape) for k, v in current.items()}, {k: np.shape(v) for k, v in native.items()})
    tensors = {k: torch.tensor(np.asarray(v, dtype=np.float32)) for k, v in native.items()}
    model.load_state_dict(tensors, strict=True, assign=True)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()  # NumPy has no bfloat16


def make(config: ViTConfig, state: dict[str, np.ndarray], *, taps: bool = True, fused_attn: bool = False,
         dtype: str = "float32", model_cls=None, **layers):
    """Port factory: canonical float32 state -> forward(images) on NumPy arrays, computed in
    ``dtype`` (float32, bfloat16, float16; bfloat16 results come back as float32 arrays).

    ``model_cls`` and ``layers`` (embed_layer, block_fn, attn_layer, mlp_layer) swap in other
    module classes, as timm's VisionTransformer allows.
    """
    require_original_vit(config, FRAMEWORK)
    validate_state(state, config)
    with torch.device("meta"):  # no random init: every tensor comes from the state
        model = (model_cls or VisionTransformer)(config, fused_attn, **layers)
    load_state_dict(model, to_native(state, FRAMEWORK))
    model.to(DTYPES[dtype]).eval()

    @torch.inference_mode()
    def forward(images: np.ndarray):
        out = model(torch.tensor(np.asarray(images)), return_taps=taps)  # a copy: the caller may hand read-only arrays
        return {k: _numpy(v) for k, v in out.items()} if taps else _numpy(out)

    return forward


make.supports = ORIGINAL_VIT  # conformance.support: verify and the plugin refuse the rest by name


def make_attention(state, *, dim, context_dim=None, num_heads, head_dim=None, qkv_bias=True, fused_attn=False,
                   model_cls=None):
    """Attention factory: canonical ``q``/``kv``/``proj`` state -> forward(x, context=None, mask=None)
    on NumPy arrays, returning (out, weights); weights are None on the fused path."""
    with torch.device("meta"):
        model = (model_cls or MultiHeadAttention)(dim, context_dim, num_heads, head_dim, qkv_bias, fused_attn=fused_attn)
    validate_state(state, expected=mha_shapes(dim, context_dim, num_heads, model.head_dim, qkv_bias))
    load_state_dict(model, to_native(state, FRAMEWORK))

    @torch.inference_mode()
    def forward(x, context=None, mask=None):
        # Copies: the caller may hand read-only arrays.
        x, context, mask = (None if a is None else torch.tensor(np.asarray(a)) for a in (x, context, mask))
        out, attn = (model(x, context, mask), None) if fused_attn else model(x, context, mask, return_weights=True)
        return out.numpy(), None if attn is None else attn.numpy()

    return forward
