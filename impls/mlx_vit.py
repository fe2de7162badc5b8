"""The MLX port: a timm-style VisionTransformer in float32, in eval mode.

Parallel to numpy_vit.py (the spec), torch_vit.py and jax_vit.py: same classes, same order.
MLX convs take NHWC, so PatchEmbed transposes the NCHW input; its kernel is OHWI.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from impls.mlx_blas import use_openblas

use_openblas()  # before mlx.core: MLX then binds cblas_sgemm to OpenBLAS (see impls/mlx_blas.py)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

from impls.protocol import (  # noqa: E402
    VIT_FAMILY,
    AdamW,
    Loss,
    Perturbed,
    ViTConfig,
    check_images,
    check_packed,
    mlp_norm_eps,
    naflex_factory,
    packed_rows,
    tap_shapes,
)
from impls.mlx_pos_embed import (  # noqa: F401 - the position schemes, re-exported as the model's
    pos_table,
    resample_pos_embed,
    sincos_2d_pos_embed,
    sinusoid_1d_pos_embed,
    rope_tables,
    rotate_tokens,
)  # noqa: E402
from impls.rope_settings import block_rope  # noqa: E402
from impls.relative_position import relative_position_index  # noqa: E402
from impls.windows import block_grid, num_windows, rel_pos_args, rel_pos_index, token_index, window_index, window_mask  # noqa: E402
from weights import check_exact_match, from_native, mha_shapes, to_native, validate_state  # noqa: E402

FRAMEWORK = "mlx"
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


# ----------------------------------------------------------------------------- functional


def _dead_rows(mask: mx.array) -> mx.array:
    """Query rows in which the mask leaves no key."""
    keep = mask if mask.dtype == mx.bool_ else mask > -mx.inf
    return mx.logical_not(mx.any(keep, axis=-1, keepdims=True))


def to_patches(x, patch_size):
    """(B, C, H, W) -> (B, gh * gw, C * ph * pw): each patch flattened (c p1 p2), as the conv
    kernel is; the remainder's pixels unread."""
    B, C, H, W = x.shape
    ph, pw = patch_size
    x = x[:, :, : H // ph * ph, : W // pw * pw]
    x = x.reshape(B, C, H // ph, ph, W // pw, pw).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // ph) * (W // pw), C * ph * pw)


def split_heads(x, num_heads: int):
    """(B, N, H * hd) -> (B, H, N, hd)."""
    B, N, _ = x.shape
    return x.reshape(B, N, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, hd) -> (B, N, H * hd), head-major: column h * hd + d, as timm's proj expects."""
    B, H, N, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, N, H * hd)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, fused=False, tap=None):
    """softmax(q k^T * scale + mask) v over the key axis; returns (out, weights).

    ``mask`` broadcasts to (B, H, Nq, Nk): boolean keeps where True, float is added to the
    logits. A query row with every key masked gives zero weights and a zero output
    (mx.fast.scaled_dot_product_attention alone would average the values there).
    The fused path returns no weights; ``tap`` sees the weights before they weight the values.
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
    attn = attn if tap is None else tap(attn)  # the weights as they weight the values
    return attn @ v, attn


def window_partition(x, grid, window_size: int):
    """(B, gh gw, D) -> (B nW, w w, D): the grid zero-padded to whole windows, in impls/windows.py's order."""
    B, _, D = x.shape
    x = mx.concatenate([x, mx.zeros((B, 1, D), dtype=x.dtype)], axis=1)  # the padding's token
    return x[:, mx.array(window_index(grid, window_size))].reshape(-1, window_size**2, D)


def window_unpartition(x, grid, window_size: int):
    """(B nW, w w, D) -> (B, gh gw, D): the windows back on the grid, the padding dropped."""
    x = x.reshape(-1, num_windows(grid, window_size) * window_size**2, x.shape[-1])
    return x[:, mx.array(token_index(grid, window_size))]


def decomposed_rel_pos(q, rel_pos_h, rel_pos_w, size):
    """(B, H, N, N) for q (B, H, N, hd) on an (S_h, S_w) grid: q's products with the tables' rows at
    each key's row offset plus those at its column offset (timm's get_decomposed_rel_pos_bias)."""
    B, H, N, hd = q.shape
    r_q = q.reshape(B, H, *size, hd)
    Rh = rel_pos_h[mx.array(rel_pos_index(size[0]))]  # (S_h, S_h, hd)
    Rw = rel_pos_w[mx.array(rel_pos_index(size[1]))]
    rel_h = mx.einsum("bnhwc,hkc->bnhwk", r_q, Rh)
    rel_w = mx.einsum("bnhwc,wkc->bnhwk", r_q, Rw)
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, N, N)


# ----------------------------------------------------------------------------- layers

Linear = nn.Linear
LayerNorm = nn.LayerNorm
RmsNorm = nn.RMSNorm  # timm's RmsNorm: x / sqrt(mean(x^2) + eps) * weight, statistics in float32
GELU = nn.GELU  # exact (erf) by default
Conv2d = nn.Conv2d
Identity = nn.Identity


def norm_layer(config: ViTConfig, dim: int):
    """The model's norm (``config.norm_layer``): LayerNorm (with or without its bias) or RmsNorm."""
    if config.norm_layer == "rmsnorm":
        return RmsNorm(dim, eps=config.norm_eps)
    return LayerNorm(dim, eps=config.norm_eps, bias=config.norm_bias)


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), OpenAI CLIP's activation (timm's QuickGELU)."""

    def __call__(self, x):
        return x * mx.sigmoid(1.702 * x)  # nn.GELU(approx="fast") computes the same


ACT_LAYERS = {"gelu": GELU, "gelu_tanh": partial(GELU, approx="precise"), "quick_gelu": QuickGELU, "silu": nn.SiLU}


def _kept(keep) -> dict:
    """A packed batch's ``keep`` as a keyword (none for images: a layer swapped in need not take it)."""
    return {} if keep is None else {"keep": keep}


def record_tap(taps, name, value):
    """Record a stage's output; a gradient pass's taps (impls.Perturbed) continue it perturbed."""
    if taps is None:
        return value
    if isinstance(taps, Perturbed):
        value = taps.perturb(name, value)
    taps[name] = value
    return value


class LayerScale(nn.Module):
    """timm's LayerScale: a per-channel gamma on a residual branch."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = mx.zeros((dim,))

    def __call__(self, x):
        return x * self.gamma


class PatchEmbed(nn.Module):
    """Non-overlapping p x p patches, each projected: a conv with stride = kernel = patch; with
    patch_norm, the patches flattened (c p1 p2) and normalised, then projected by the same kernel;
    with embed_norm, a norm after the projection."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.grid_size = config.grid_size
        if config.patch_norm:
            self.patch_norm = norm_layer(config, config.patch_dim)
        self.proj = Conv2d(
            config.in_chans, config.embed_dim, config.patch_size, stride=config.patch_size, bias=config.use_patch_bias
        )
        if config.embed_norm:
            self.norm = norm_layer(config, config.embed_dim)

    def project(self, x, taps=None, name="patch_embed"):
        """The projection's output, (B, gh * gw, D), row-major over the grid."""
        if "patch_norm" not in self:
            x = self.proj(x.transpose(0, 2, 3, 1))  # NCHW -> NHWC -> (B, gh, gw, D)
            return x.reshape(x.shape[0], -1, x.shape[-1])
        return self.project_patches(to_patches(x, self.patch_size), taps, name)

    def project_patches(self, x, taps=None, name="patch_embed"):
        """Patches flattened (c p1 p2), (B, L, C * ph * pw), projected by the kernel (normalised first)."""
        if "patch_norm" in self:
            x = self.patch_norm(x)
            x = record_tap(taps, f"{name}.patch_norm", x)
        w = self.proj.weight.transpose(0, 3, 1, 2)  # OHWI -> OIHW: (c p1 p2) as the patches
        y = x @ w.reshape(w.shape[0], -1).T
        return y + self.proj.bias if "bias" in self.proj else y

    def __call__(self, x, taps=None, name="patch_embed", packed=False):
        """``packed``: ``x`` holds patches flattened (p1 p2 c), a packed batch's (B, L, ph * pw * C)."""
        if packed:
            (ph, pw), (B, L, _) = self.patch_size, x.shape
            x = self.project_patches(x.reshape(B, L, ph, pw, -1).transpose(0, 1, 4, 2, 3).reshape(B, L, -1), taps, name)
        else:
            x = self.project(x, taps, name)
        x = record_tap(taps, name, x)
        if "norm" in self:
            x = self.norm(x)
            x = record_tap(taps, f"{name}.norm", x)
        return x


class Attention(nn.Module):
    """timm's Attention: fused qkv with rows ordered (3, heads, head_dim)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        fused_attn: bool = False,
        qk_norm: bool = False,
        proj_bias: bool = True,
        norm_eps: float = 1e-6,
        rotate_half: bool = False,
        num_prefix_tokens: int = 0,
        k_bias: bool = True,
        qkv_fused: bool = True,
        window_size: tuple[int, int] | None = None,
        use_rel_pos: bool = False,
        input_size: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.rotate_half, self.num_prefix_tokens = rotate_half, num_prefix_tokens  # rope (timm's Eva)
        self.fused_attn = fused_attn
        if qkv_fused:
            self.qkv = Linear(dim, dim * 3, bias=qkv_bias and k_bias)
            if qkv_bias and not k_bias:  # timm's Eva and BEiT: q's and v's biases apart, k none
                self.q_bias, self.v_bias = mx.zeros((dim,)), mx.zeros((dim,))
        else:  # timm's Eva with qkv_fused=False
            self.q_proj = Linear(dim, dim, bias=qkv_bias)
            self.k_proj = Linear(dim, dim, bias=qkv_bias and k_bias)
            self.v_proj = Linear(dim, dim, bias=qkv_bias)
        self.q_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else Identity()  # per head, before the scale
        self.k_norm = LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else Identity()
        self.proj = Linear(dim, dim, bias=proj_bias)
        self.window_size = window_size  # BEiT: a learned bias per head and relative position
        if window_size is not None:  # every (dy, dx) of the grid, then the class token's three
            rows = (2 * window_size[0] - 1) * (2 * window_size[1] - 1) + 3
            self.relative_position_bias_table = mx.zeros((rows, num_heads))
        self.use_rel_pos, self.input_size = use_rel_pos, input_size  # SAM: per row and column offset
        if use_rel_pos:
            self.rel_pos_h = mx.zeros((2 * input_size[0] - 1, self.head_dim))
            self.rel_pos_w = mx.zeros((2 * input_size[1] - 1, self.head_dim))

    def _get_rel_pos_bias(self):
        """(1, H, N, N): the table's row for each (query, key) pair's relative position, per head."""
        index = mx.array(relative_position_index(self.window_size))
        return self.relative_position_bias_table[index].transpose(2, 0, 1)[None]

    def project(self, x):
        """q, k and v, each (B, H, N, hd)."""
        B, N, C = x.shape
        if "qkv" not in self:
            return [split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj)]
        if "q_bias" not in self:
            qkv = self.qkv(x)
        else:
            qkv = mx.addmm(mx.concatenate([self.q_bias, mx.zeros_like(self.q_bias), self.v_bias]), x, self.qkv.weight.T)
        qkv = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def __call__(self, x, taps=None, name="attn", rope=None, keep=None, window=None):
        """``keep``: (B, N) the tokens that are an image's, the keys the rest attend (a packed batch's);
        ``window``: (1, 1, N, N) the keys each query attends (Qwen2.5-VL's windows)."""
        q, k, v = self.project(x)
        q = record_tap(taps, f"{name}.q", q)
        k = record_tap(taps, f"{name}.k", k)
        v = record_tap(taps, f"{name}.v", v)
        if isinstance(self.q_norm, LayerNorm):
            q, k = self.q_norm(q), self.k_norm(k)
            q = record_tap(taps, f"{name}.q_norm", q)
            k = record_tap(taps, f"{name}.k_norm", k)
        if rope is not None:  # the patch tokens' q and k turned by their positions (timm's Eva)
            q = record_tap(taps, f"{name}.q_rope", rotate_tokens(q, rope, self.num_prefix_tokens, self.rotate_half))
            k = record_tap(taps, f"{name}.k_rope", rotate_tokens(k, rope, self.num_prefix_tokens, self.rotate_half))
        bias = None
        if self.window_size is not None:  # added to the scaled logits
            bias = record_tap(
                taps, f"{name}.rel_pos_bias", mx.broadcast_to(self._get_rel_pos_bias(), (*q.shape[:3], q.shape[2]))
            )
        if self.use_rel_pos:  # q's products with the offsets' rows, added to the scaled logits
            bias = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, self.input_size)
            bias = record_tap(taps, f"{name}.rel_pos", bias)
        if window is not None:  # Qwen2.5-VL's windows: each query's own window's keys
            bias = window if bias is None else mx.where(window, bias, -mx.inf)
        if keep is not None:  # the padding's keys out: a boolean mask, or -inf added to the bias
            keys = keep[:, None, None, :]
            bias = keys if bias is None else keys & bias if bias.dtype == mx.bool_ else mx.where(keys, bias, -mx.inf)
        if self.fused_attn and taps is None:
            x = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=bias)
        else:
            q = q * self.scale
            attn = q @ k.swapaxes(-2, -1)
            if bias is not None:
                attn = mx.where(bias, attn, -mx.inf) if bias.dtype == mx.bool_ else attn + bias
            attn = mx.softmax(attn, axis=-1, precise=True)  # over keys, in float32
            attn = record_tap(taps, f"{name}.weights", attn)
            x = attn @ v
        x = merge_heads(x)  # head-major
        x = self.proj(x)
        x = record_tap(taps, name, x)
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
        self.scale = self.head_dim**-0.5
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


class AttentionPoolLatent(MultiHeadAttention):
    """timm's AttentionPoolLatent (the 'map' head): a learned latent query attends over the
    tokens, then x + mlp(norm(x)); the latent's output is the pooled feature."""

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float, act_layer: str, norm_eps: float, fused_attn: bool = False
    ):
        super().__init__(dim, num_heads=num_heads, fused_attn=fused_attn)
        self.latent = mx.zeros((1, 1, dim))
        self.norm = LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer)

    def __call__(self, x, taps=None, name="attn_pool", keep=None):
        B, N, _ = x.shape
        q = split_heads(self.q(mx.broadcast_to(self.latent, (B, *self.latent.shape[1:]))), self.num_heads)
        kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        q = record_tap(taps, f"{name}.q", q)
        k = record_tap(taps, f"{name}.k", k)
        v = record_tap(taps, f"{name}.v", v)
        x, attn = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=None if keep is None else keep[:, None, None, :],
            scale=self.scale,
            fused=self.fused_attn and taps is None,
            tap=lambda w: record_tap(taps, f"{name}.weights", w),
        )
        x = self.proj(merge_heads(x))
        x = record_tap(taps, f"{name}.proj", x)
        h = self.norm(x)
        h = record_tap(taps, f"{name}.norm", h)
        x = x + self.mlp(h, taps, f"{name}.mlp")
        x = x[:, 0]  # the latent's token
        x = record_tap(taps, name, x)
        return x


class Mlp(nn.Module):
    """timm's Mlp: fc1, act, fc2; with timm's scale_mlp, the hidden features normalised before fc2
    (EVA02's normed SwiGLU). The gated MLPs below differ only in fc1 and what the activation reads."""

    default_act = "gelu"

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        act_layer: str | None = None,
        bias: bool = True,
        norm_eps: float | None = None,
    ):
        super().__init__()
        width = self.init_fc1(in_features, hidden_features, bias)  # what fc2 reads
        self.act = ACT_LAYERS[act_layer or self.default_act]()
        self.fc2 = Linear(width, in_features, bias=bias)
        if norm_eps is not None:  # timm's scale_mlp
            self.norm = LayerNorm(width, eps=norm_eps)

    def init_fc1(self, in_features, hidden_features, bias) -> int:
        self.fc1 = Linear(in_features, hidden_features, bias=bias)
        return hidden_features

    def hidden(self, x):
        return self.act(self.fc1(x))

    def __call__(self, x, taps=None, name="mlp"):
        x = record_tap(taps, f"{name}.act", self.hidden(x))
        if "norm" in self:
            x = record_tap(taps, f"{name}.norm", self.norm(x))
        return record_tap(taps, name, self.fc2(x))


class SwiGLUPacked(Mlp):
    """timm's SwiGLUPacked (GluMlp, gate first): fc1 rows are the gate, then the value."""

    default_act = "silu"

    def init_fc1(self, in_features, hidden_features, bias) -> int:
        return super().init_fc1(in_features, hidden_features, bias) // 2

    def hidden(self, x):
        gate, x = mx.split(self.fc1(x), 2, axis=-1)
        return self.act(gate) * x


class SwiGLU(Mlp):
    """timm's SwiGLU: separate gate (fc1_g) and value (fc1_x) projections."""

    default_act = "silu"

    def init_fc1(self, in_features, hidden_features, bias) -> int:
        self.fc1_g = Linear(in_features, hidden_features, bias=bias)
        self.fc1_x = Linear(in_features, hidden_features, bias=bias)
        return hidden_features

    def hidden(self, x):
        return self.act(self.fc1_g(x)) * self.fc1_x(x)


MLP_LAYERS = {"mlp": Mlp, "swiglu_packed": SwiGLUPacked, "swiglu": SwiGLU}


class Block(nn.Module):
    """Pre-norm block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))); two distinct norms
    (ls1, ls2: LayerScale with init_values, else identities)."""

    def __init__(self, config: ViTConfig, fused_attn: bool = False, attn_layer=None, mlp_layer=None, index: int = 0):
        super().__init__()
        dim = config.embed_dim
        self.window_size = config.block_window(index)  # SAM: 0, the block attends globally
        self.window_cut = config.block_window_cut(index)  # Qwen2.5-VL: 0, no windows cut at the edge
        self.norm1 = norm_layer(config, dim)
        self.attn = (attn_layer or Attention)(
            dim,
            config.num_heads,
            qkv_bias=config.qkv_bias,
            fused_attn=fused_attn,
            qk_norm=config.qk_norm,
            proj_bias=config.proj_bias,
            norm_eps=config.norm_eps,
            rotate_half=config.rope_rotate_half,
            num_prefix_tokens=config.num_prefix_tokens,
            k_bias=config.k_bias,
            qkv_fused=config.qkv_fused,
            window_size=config.grid_size if config.rel_pos_bias else None,
            **rel_pos_args(config, index),
        )
        self.ls1 = LayerScale(dim) if config.init_values is not None else Identity()
        self.norm2 = norm_layer(config, dim)
        self.mlp = (mlp_layer or MLP_LAYERS[config.mlp_layer])(
            dim, config.mlp_hidden_dim, config.act_layer, config.use_mlp_bias, **mlp_norm_eps(config)
        )
        self.ls2 = LayerScale(dim) if config.init_values is not None else Identity()

    def __call__(self, x, taps=None, name="blocks.0", rope=None, keep=None, grid=None):
        """``grid``: the tokens' patch grid, where the block attends in windows."""
        h = self.norm1(x)
        h = record_tap(taps, f"{name}.norm1", h)
        if self.window_size:
            h = window_partition(h, grid, self.window_size)
        h = self.attn(
            h, taps, f"{name}.attn", **({} if rope is None else {"rope": rope}), **_kept(keep), **self._cut(grid)
        )
        if isinstance(self.ls1, LayerScale):
            h = self.ls1(h)
            h = record_tap(taps, f"{name}.ls1", h)
        if self.window_size:
            h = window_unpartition(h, grid, self.window_size)
        x = x + h
        h = self.norm2(x)
        h = record_tap(taps, f"{name}.norm2", h)
        h = self.mlp(h, taps, f"{name}.mlp")
        if isinstance(self.ls2, LayerScale):
            h = self.ls2(h)
            h = record_tap(taps, f"{name}.ls2", h)
        x = x + h
        x = record_tap(taps, name, x)
        return x

    def _cut(self, grid) -> dict:
        """Qwen2.5-VL's windows as the attention's keyword: the keys each query attends, (1, 1, N, N)
        (none elsewhere: an attention swapped in need not take it)."""
        return {"window": mx.array(window_mask(grid, self.window_cut))[None, None]} if self.window_cut else {}


class RotaryEmbeddingMixed(nn.Module):
    """timm's RoPE-Mixed: the rotation's learned frequencies, (2, depth, heads, head_dim / 2)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.freqs = mx.zeros((2, config.depth, config.num_heads, config.head_dim // 2))


class VisionTransformer(nn.Module):
    def __init__(
        self,
        config: ViTConfig,
        fused_attn: bool = False,
        embed_layer=None,
        block_fn=None,
        attn_layer=None,
        mlp_layer=None,
    ):
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.patch_embed = (embed_layer or PatchEmbed)(config)
        if config.rope_type == "mixed":
            self.rope = RotaryEmbeddingMixed(config)
        if config.class_token:
            self.cls_token = mx.zeros((1, 1, D))
        if config.reg_tokens:
            self.reg_token = mx.zeros((1, config.reg_tokens, D))
        if config.pos_embed == "learn":
            self.pos_embed = mx.zeros((1, config.embed_len, D))
        if config.pre_norm:
            self.norm_pre = norm_layer(config, D)
        self.blocks = [
            (block_fn or Block)(config, fused_attn, attn_layer, mlp_layer, index=i) for i in range(config.depth)
        ]
        if config.use_final_norm:
            self.norm = norm_layer(config, D)
        if config.global_pool == "map":
            self.attn_pool = AttentionPoolLatent(
                D, config.pool_num_heads, config.mlp_ratio, config.act_layer, config.norm_eps, fused_attn
            )
        if config.use_fc_norm:
            self.fc_norm = norm_layer(config, D)
        if config.num_classes:
            self.head = Linear(D, config.num_classes)
        if config.distilled:  # DeiT: a distillation token after the class token, a head of its own
            self.dist_token = mx.zeros((1, 1, D))
            if config.num_classes:
                self.head_dist = Linear(D, config.num_classes)

    def _pos_embed(self, x, grid):
        B, _, D = x.shape
        tokens = [self[k] for k in ("cls_token", "dist_token", "reg_token") if k in self]
        prefix = [mx.broadcast_to(t, (B, t.shape[1], D)) for t in tokens]  # class, distillation, registers
        learned = self.pos_embed if self.config.pos_embed == "learn" else None
        found = pos_table(self.config, learned, grid, x.shape[1] + sum(t.shape[1] for t in prefix))
        if found is None:
            return mx.concatenate(prefix + [x], axis=1)
        pos, covers_prefix = found
        pos = pos.astype(x.dtype)  # a fixed table is computed in float32
        if covers_prefix:  # the learned table (unless no_embed_class), the sinusoid
            return mx.concatenate(prefix + [x], axis=1) + pos
        return mx.concatenate(prefix + [x + pos], axis=1)  # the prefix tokens join after, without a position

    def _pos_embed_packed(self, x, rows):
        """Each row of a packed batch given its prefix tokens and positions at its own grid; its
        padding as projected."""
        parts = [
            mx.concatenate([self._pos_embed(x[i : i + 1, :n], grid), x[i : i + 1, n:]], axis=1)
            for i, (n, grid) in enumerate(rows)
        ]
        return mx.concatenate(parts, axis=0)

    def forward_packed(self, batch, taps=None, rows=None):
        """A packed batch (NaFlex: ``patches``, ``patch_coord``, ``patch_valid``; docs/verify.md):
        each row's table at its own grid, its padding kept out of every attention and pool.
        ``rows``: each row's patch count and grid (``packed_rows``), where the coordinates cannot be read."""
        c = self.config
        x, coord, valid = (batch[k] for k in ("patches", "patch_coord", "patch_valid"))
        x = self.patch_embed(x.astype(self.patch_embed.proj.weight.dtype), taps, packed=True)
        x = self._pos_embed_packed(x, packed_rows(coord, valid) if rows is None else rows)
        keep = mx.concatenate([mx.ones((x.shape[0], c.num_prefix_tokens), mx.bool_), valid.astype(mx.bool_)], axis=1)
        return self.forward_head(self.forward_tokens(x, taps, keep=keep), taps, keep)

    def forward_features(self, x, taps=None):
        grid = self.config.grid_at(x.shape[2:])
        x = self.patch_embed(x, taps)
        return self.forward_tokens(self._pos_embed(x, grid), taps, grid)

    def forward_tokens(self, x, taps=None, grid=None, keep=None):
        """From the embedded tokens on; ``grid`` the images' (rotary tables), ``keep`` a packed
        batch's tokens that are an image's (its rows, embedded at their own grids)."""
        x = record_tap(taps, "embed", x)
        if self.config.pre_norm:
            x = self.norm_pre(x)
            x = record_tap(taps, "norm_pre", x)
        rope = rope_tables(
            self.config, grid, self.rope.freqs if "rope" in self else None
        )  # None without rotary embeddings
        for i, blk in enumerate(self.blocks):
            r = block_rope(rope, i, self.config)  # RoPE-Mixed's tables are per block
            x = blk(
                x,
                taps,
                f"blocks.{i}",
                **({} if r is None else {"rope": r}),
                **_kept(keep),
                **block_grid(grid, i, self.config),
            )
        if self.config.use_final_norm:
            x = self.norm(x)
            x = record_tap(taps, "norm", x)
        return x

    def pool(self, x, taps=None, keep=None):
        pool = self.config.global_pool
        if pool == "token":
            return x[:, 0]
        x = x[:, self.config.pool_skip :]  # the patch tokens, and the prefix with pool_include_prefix
        if pool == "map":
            return self.attn_pool(x, taps, **_kept(None if keep is None else keep[:, self.config.pool_skip :]))
        if keep is not None:  # a packed batch: each row's own tokens
            w = keep[:, self.config.pool_skip :, None]
            mean = ((x * w).astype(mx.float32).sum(axis=1) / w.sum(axis=1)).astype(x.dtype)  # accumulated in float32
            top = mx.where(w, x, -mx.inf).max(axis=1)
        else:
            mean = x.astype(mx.float32).mean(axis=1).astype(x.dtype)  # accumulated in float32
            top = x.max(axis=1) if pool != "avg" else None
        return mean if pool == "avg" else top if pool == "max" else 0.5 * (top + mean)  # avgmax

    def forward_head(self, x, taps=None, keep=None):
        if self.config.distilled:
            return self.forward_head_distilled(x, taps)
        x = self.pool(x, taps, **_kept(keep))
        if self.config.use_fc_norm:
            x = self.fc_norm(x)
        x = record_tap(taps, "pooled", x)
        x = self.head(x) if self.config.num_classes else x
        x = record_tap(taps, "logits", x)
        return x

    def forward_head_distilled(self, x, taps=None):
        """timm's VisionTransformerDistilled in eval: the mean of the two heads' logits."""
        x, x_dist = x[:, 0], x[:, 1]
        x = record_tap(taps, "pooled", x)
        x_dist = record_tap(taps, "pooled_dist", x_dist)
        if self.config.num_classes:
            x, x_dist = self.head(x), self.head_dist(x_dist)
        x = (x + x_dist) / 2
        x = record_tap(taps, "logits", x)
        return x

    def __call__(self, x, return_taps: bool = False, taps=None):
        taps = ({} if return_taps else None) if taps is None else taps  # impls.Perturbed: a gradient pass
        if isinstance(x, Mapping):  # a packed batch (NaFlex)
            x = self.forward_packed(x, taps, check_packed(x, self.config))
        else:
            check_images(tuple(x.shape), str(x.dtype), self.config)
            x = x.astype(self.patch_embed.proj.weight.dtype)  # float32 images in; the model runs in its weights' dtype
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


def _loaded(config: ViTConfig, state, dtype: str, fused_attn: bool, model_cls, layers: dict) -> nn.Module:
    """The model with the canonical state loaded strictly, in ``dtype``, in eval mode."""
    validate_state(state, config)
    model = (model_cls or VisionTransformer)(config, fused_attn, **layers)
    load_state_dict(model, to_native(state, FRAMEWORK))
    model.set_dtype(DTYPES[dtype])
    model.eval()  # MLX modules start in training mode
    return model


def make(
    config: ViTConfig,
    state: dict[str, np.ndarray],
    *,
    taps: bool = True,
    fused_attn: bool = False,
    dtype: str = "float32",
    compiled: bool = False,
    model_cls=None,
    **layers,
):
    """Port factory: canonical float32 state -> forward(images) on NumPy arrays, computed in
    ``dtype`` (float32, bfloat16, float16; bfloat16 results come back as float32 arrays).

    ``model_cls`` and ``layers`` (embed_layer, block_fn, attn_layer, mlp_layer) swap in other
    module classes, as timm's VisionTransformer allows. ``compiled`` runs it through mx.compile.
    """
    model = _loaded(config, state, dtype, fused_attn, model_cls, layers)
    call = lambda x: model(x, return_taps=taps)
    call = mx.compile(call) if compiled else call  # the weights are captured as constants

    def forward(images: np.ndarray):
        if isinstance(images, Mapping):  # a packed batch (the model checks it): each row's grid read, uncompiled
            out = model({k: mx.array(np.asarray(v)) for k, v in images.items()}, return_taps=taps)
        else:
            images = np.asarray(images)
            check_images(images.shape, str(images.dtype), config)  # mx.array() would cast float64 silently
            out = call(mx.array(images))
        mx.eval(out)
        return {k: _numpy(v) for k, v in out.items()} if taps else _numpy(out)

    return forward


make.supports = VIT_FAMILY  # every option of the family (conformance.support)
make_naflex = naflex_factory(make)  # the same port on packed batches (impls.protocol.NAFLEX_FAMILY)


def make_attention(
    state, *, dim, context_dim=None, num_heads, head_dim=None, qkv_bias=True, fused_attn=False, model_cls=None
):
    """Attention factory: canonical ``q``/``kv``/``proj`` state -> forward(x, context=None, mask=None)
    on NumPy arrays, returning (out, weights); weights are None on the fused path."""
    model = (model_cls or MultiHeadAttention)(dim, context_dim, num_heads, head_dim, qkv_bias, fused_attn=fused_attn)
    validate_state(state, expected=mha_shapes(dim, context_dim, num_heads, model.head_dim, qkv_bias))
    load_state_dict(model, to_native(state, FRAMEWORK))
    model.eval()

    def forward(x, context=None, mask=None):
        context = None if context is None else mx.array(context)
        mask = None if mask is None else mx.array(mask)
        out, attn = (
            (model(mx.array(x), context, mask), None)
            if fused_attn
            else model(mx.array(x), context, mask, return_weights=True)
        )
        mx.eval(out, attn)
        return np.array(out), None if attn is None else np.array(attn)

    return forward


# ----------------------------------------------------------------------------- gradients


def loss_value(logits: mx.array, loss: Loss) -> mx.array:
    """The loss of the logits (impls.protocol.Loss), with MLX's own ops."""
    if loss.kind == "linear":
        return (logits * mx.array(loss.weights, dtype=logits.dtype)).sum()
    return nn.losses.cross_entropy(logits, mx.array(loss.labels), reduction="mean")


def make_grad(
    config: ViTConfig,
    state: dict[str, np.ndarray],
    *,
    dtype: str = "float32",
    fused_attn: bool = False,
    model_cls=None,
    **layers,
):
    """Gradient factory: canonical state -> grad(images, loss) returning {"loss": float, "params":
    {canonical key: dL/dparam}, "images": dL/dimages, "taps": {tap: dL/d(stage output)}}, by
    mx.value_and_grad in ``dtype``; a tap's cotangent is the gradient of a zero added there."""
    from mlx.utils import tree_flatten

    model = _loaded(config, state, dtype, fused_attn, model_cls, layers)
    used: list[str] = []

    def objective(params, x, zeros, loss):
        model.update(params)
        taps = Perturbed(zeros)
        value = loss_value(model(x, taps=taps), loss)
        used[:] = taps.used
        return value

    differentiate = mx.value_and_grad(objective, argnums=(0, 1, 2))

    def grad(images: np.ndarray, loss: Loss):
        images = np.asarray(images)
        check_images(images.shape, str(images.dtype), config)
        zeros = {
            k: mx.zeros(shape, dtype=DTYPES[dtype])
            for k, shape in tap_shapes(config, len(images), images.shape[-2:]).items()
        }
        value, (g_params, g_images, g_taps) = differentiate(model.trainable_parameters(), mx.array(images), zeros, loss)
        mx.eval(value, g_params, g_images, g_taps)
        native = {k: _numpy(v) for k, v in tree_flatten(g_params)}
        return {
            "loss": float(value),
            "params": from_native(native, FRAMEWORK),
            "images": _numpy(g_images),
            "taps": {k: _numpy(g_taps[k]) for k in used},
        }

    return grad


def adamw(hp: AdamW):
    """bias_correction=True: MLX's default (False) is not torch's AdamW (docs/gradients.md).
    The undecayed parameters (hp.decays) get their own AdamW through MultiOptimizer."""
    import mlx.optimizers as optim

    def make(weight_decay):
        return optim.AdamW(
            learning_rate=hp.lr, betas=list(hp.betas), eps=hp.eps, weight_decay=weight_decay, bias_correction=True
        )

    return optim.MultiOptimizer([make(0.0), make(hp.weight_decay)], [lambda key, p: not hp.decays(key, p.ndim)])


def adamw_step(
    config: ViTConfig,
    state: dict[str, np.ndarray],
    images,
    loss: Loss,
    hp: AdamW,
    *,
    dtype: str = "float32",
    optimizer=adamw,
    fused_attn: bool = False,
    model_cls=None,
    **layers,
):
    """One AdamW step from a fresh optimizer (``optimizer(hp)``): the new canonical state."""
    from mlx.utils import tree_flatten

    model = _loaded(config, state, dtype, fused_attn, model_cls, layers)
    images = np.asarray(images)
    check_images(images.shape, str(images.dtype), config)
    _, grads = nn.value_and_grad(model, lambda x: loss_value(model(x), loss))(mx.array(images))
    optimizer(hp).update(model, grads)
    mx.eval(model.parameters())
    return from_native({k: _numpy(v) for k, v in tree_flatten(model.parameters())}, FRAMEWORK)
