"""The float64 NumPy oracle: the ViT written as plainly as the math. This file is the spec.

Parallel to torch_vit.py, mlx_vit.py and jax_vit.py: same classes, same order, same names.
Everything is computed in float64; the weights are the canonical (timm) tensors upcast.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy.special import erf

from impls.protocol import (
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
from impls.numpy_pos_embed import (  # noqa: F401 - the position schemes, re-exported as the model's
    pos_table,
    resample_pos_embed,
    sincos_2d_angles,
    sincos_2d_pos_embed,
    sinusoid_1d_angles,
    sinusoid_1d_pos_embed,
    rope_tables,
    rotate_tokens,
)
from impls.rope_settings import block_rope
from impls.relative_position import relative_position_index
from impls.windows import block_grid, num_windows, rel_pos_args, rel_pos_index, token_index, window_index, window_mask
from weights import check_exact_match, mha_shapes, to_native, validate_state

FRAMEWORK = "numpy"


# ----------------------------------------------------------------------------- functional


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    # A row that is -inf everywhere (fully masked) gives exp() = 0, not NaN.
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s == 0.0, 1.0, s)


def layer_norm(x: np.ndarray, weight, bias, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased, as every framework
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rms_norm(x: np.ndarray, weight, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def gelu(x: np.ndarray) -> np.ndarray:
    # The exact (erf) form, as timm, torch and MLX use by default.
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    # torch's GELU(approximate="tanh"), timm's "gelu_tanh" (SigLIP).
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def quick_gelu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(1.702 x), OpenAI CLIP's activation (timm's QuickGELU).
    return x / (1.0 + np.exp(-1.702 * x))


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), the SwiGLU gate's activation.
    return x / (1.0 + np.exp(-x))


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "quick_gelu": quick_gelu, "silu": silu}


def to_patches(x, patch_size):
    """(B, C, H, W) -> (B, gh * gw, C * ph * pw): each patch flattened (c p1 p2), as the conv
    kernel is; the remainder's pixels unread."""
    B, C, H, W = x.shape
    ph, pw = patch_size
    x = x[:, :, : H // ph * ph, : W // pw * pw]
    x = x.reshape(B, C, H // ph, ph, W // pw, pw).transpose((0, 2, 4, 1, 3, 5))  # one tuple: autograd traces it
    return x.reshape(B, (H // ph) * (W // pw), C * ph * pw)


def split_heads(x, num_heads: int):
    """(B, N, H * hd) -> (B, H, N, hd)."""
    B, N, _ = x.shape
    return x.reshape(B, N, num_heads, -1).transpose((0, 2, 1, 3))


def merge_heads(x):
    """(B, H, N, hd) -> (B, N, H * hd), head-major: column h * hd + d, as timm's proj expects."""
    B, H, N, hd = x.shape
    return x.transpose((0, 2, 1, 3)).reshape(B, N, H * hd)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, fused=False, tap=None):
    """softmax(q k^T * scale + mask) v over the key axis; returns (out, weights).

    ``mask`` broadcasts to (B, H, Nq, Nk): boolean keeps where True, float is added to the
    logits. A query row with every key masked gives zero weights and a zero output.
    ``fused`` exists for parity with the other ports; the oracle has one path. ``tap`` sees the
    weights before they weight the values.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    attn = (q * scale) @ np.swapaxes(k, -2, -1)
    if mask is not None:
        mask = np.asarray(mask)
        attn = np.where(mask, attn, -np.inf) if mask.dtype == np.bool_ else attn + mask
    attn = softmax(attn, axis=-1)
    attn = attn if tap is None else tap(attn)  # the weights as they weight the values
    return attn @ v, attn


def window_partition(x, grid, window_size: int):
    """(B, gh gw, D) -> (B nW, w w, D): the grid zero-padded to whole windows, in impls/windows.py's order."""
    B, _, D = x.shape
    x = np.concatenate([x, np.zeros((B, 1, D), x.dtype)], axis=1)  # the padding's token
    return x[:, window_index(grid, window_size)].reshape(-1, window_size**2, D)


def window_unpartition(x, grid, window_size: int):
    """(B nW, w w, D) -> (B, gh gw, D): the windows back on the grid, the padding dropped."""
    x = x.reshape(-1, num_windows(grid, window_size) * window_size**2, x.shape[-1])
    return x[:, token_index(grid, window_size)]


def decomposed_rel_pos(q, rel_pos_h, rel_pos_w, size):
    """(B, H, N, N) for q (B, H, N, hd) on an (S_h, S_w) grid: q's products with the tables' rows at
    each key's row offset plus those at its column offset (timm's get_decomposed_rel_pos_bias)."""
    B, H, N, hd = q.shape
    r_q = q.reshape(B, H, *size, hd)
    Rh = rel_pos_h[rel_pos_index(size[0])]  # (S_h, S_h, hd)
    Rw = rel_pos_w[rel_pos_index(size[1])]
    rel_h = np.einsum("bnhwc,hkc->bnhwk", r_q, Rh)
    rel_w = np.einsum("bnhwc,wkc->bnhwk", r_q, Rw)
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, N, N)


# ----------------------------------------------------------------------------- layers


class Module:
    """Just enough of a module system for strict loading: arrays are parameters."""

    def named_parameters(self, prefix: str = ""):
        for name, value in vars(self).items():
            key = f"{prefix}{name}"
            if isinstance(value, np.ndarray):
                yield key, value
            elif isinstance(value, Module):
                yield from value.named_parameters(f"{key}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    yield from item.named_parameters(f"{key}.{i}.")

    def set_parameter(self, key: str, value: np.ndarray) -> None:
        *path, leaf = key.split(".")
        obj = self
        for p in path:
            obj = obj[int(p)] if isinstance(obj, list) else getattr(obj, p)
        setattr(obj, leaf, value)


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.weight = np.zeros((out_features, in_features))
        if bias:
            self.bias = np.zeros((out_features,))

    def __call__(self, x):
        y = x @ self.weight.T
        return y + self.bias if hasattr(self, "bias") else y


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float, bias: bool = True):
        self.eps = eps
        self.weight = np.zeros((dim,))
        if bias:
            self.bias = np.zeros((dim,))

    def __call__(self, x):
        return layer_norm(x, self.weight, getattr(self, "bias", 0.0), self.eps)


class RmsNorm(Module):
    """timm's RmsNorm: x / sqrt(mean(x^2) + eps) * weight, no bias (AIMv2)."""

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.weight = np.zeros((dim,))

    def __call__(self, x):
        return rms_norm(x, self.weight, self.eps)


def norm_layer(config: ViTConfig, dim: int):
    """The model's norm (``config.norm_layer``): LayerNorm (with or without its bias) or RmsNorm."""
    if config.norm_layer == "rmsnorm":
        return RmsNorm(dim, eps=config.norm_eps)
    return LayerNorm(dim, eps=config.norm_eps, bias=config.norm_bias)


class GELU(Module):
    def __init__(self, act_layer: str = "gelu"):
        self.fn = ACTIVATIONS[act_layer]

    def __call__(self, x):
        return self.fn(x)


class LayerScale(Module):
    """timm's LayerScale: a per-channel gamma on a residual branch."""

    def __init__(self, dim: int):
        self.gamma = np.zeros((dim,))

    def __call__(self, x):
        return x * self.gamma


class Identity(Module):
    def __call__(self, x):
        return x


class Conv2d(Module):
    """A conv whose stride equals its kernel, the only kind a ViT uses."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: tuple[int, int], bias: bool = True):
        self.weight = np.zeros((out_chans, in_chans, *kernel_size))  # OIHW
        if bias:
            self.bias = np.zeros((out_chans,))

    def __call__(self, x):
        B, C, H, W = x.shape
        _, _, ph, pw = self.weight.shape
        x = x[:, :, : H // ph * ph, : W // pw * pw]  # a stride-p convolution leaves the remainder unread
        patches = x.reshape(B, C, H // ph, ph, W // pw, pw)
        # out[b, i, j, o] = sum_{c, u, v} x[b, c, i*ph + u, j*pw + v] * w[o, c, u, v] + b[o]
        y = np.einsum("bciujv,ocuv->bijo", patches, self.weight)
        y = y + self.bias if hasattr(self, "bias") else y
        return y.reshape(B, -1, y.shape[-1])


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


class PatchEmbed(Module):
    """Non-overlapping p x p patches, each projected: a conv with stride = kernel = patch; with
    patch_norm, the patches flattened (c p1 p2) and normalised, then projected by the same kernel;
    with embed_norm, a norm after the projection."""

    def __init__(self, config: ViTConfig):
        self.patch_size = config.patch_size
        self.grid_size = config.grid_size
        if config.patch_norm:
            self.patch_norm = norm_layer(config, config.patch_dim)
        self.proj = Conv2d(config.in_chans, config.embed_dim, config.patch_size, bias=config.use_patch_bias)
        if config.embed_norm:
            self.norm = norm_layer(config, config.embed_dim)

    def project(self, x, taps=None, name="patch_embed"):
        """The projection's output, (B, gh * gw, D), row-major over the grid."""
        if not hasattr(self, "patch_norm"):
            return self.proj(x)
        return self.project_patches(to_patches(x, self.patch_size), taps, name)

    def project_patches(self, x, taps=None, name="patch_embed"):
        """Patches flattened (c p1 p2), (B, L, C * ph * pw), projected by the kernel (normalised first)."""
        if hasattr(self, "patch_norm"):
            x = self.patch_norm(x)
            x = record_tap(taps, f"{name}.patch_norm", x)
        y = x @ self.proj.weight.reshape(self.proj.weight.shape[0], -1).T
        return y + self.proj.bias if hasattr(self.proj, "bias") else y

    def __call__(self, x, taps=None, name="patch_embed", packed=False):
        """``packed``: ``x`` holds patches flattened (p1 p2 c), a packed batch's (B, L, ph * pw * C)."""
        if packed:
            (ph, pw), (B, L, _) = self.patch_size, x.shape
            x = self.project_patches(
                x.reshape(B, L, ph, pw, -1).transpose((0, 1, 4, 2, 3)).reshape(B, L, -1), taps, name
            )
        else:
            x = self.project(x, taps, name)
        x = record_tap(taps, name, x)
        if hasattr(self, "norm"):
            x = self.norm(x)
            x = record_tap(taps, f"{name}.norm", x)
        return x


class Attention(Module):
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
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.rotate_half, self.num_prefix_tokens = rotate_half, num_prefix_tokens  # rope (timm's Eva)
        self.fused_attn = fused_attn
        if qkv_fused:
            self.qkv = Linear(dim, dim * 3, bias=qkv_bias and k_bias)
            if qkv_bias and not k_bias:  # timm's Eva and BEiT: q's and v's biases apart, k none
                self.q_bias, self.v_bias = np.zeros((dim,)), np.zeros((dim,))
        else:  # timm's Eva with qkv_fused=False
            self.q_proj = Linear(dim, dim, bias=qkv_bias)
            self.k_proj = Linear(dim, dim, bias=qkv_bias and k_bias)
            self.v_proj = Linear(dim, dim, bias=qkv_bias)
        if qk_norm:  # over head_dim, per head, before the scale
            self.q_norm = LayerNorm(self.head_dim, eps=norm_eps)
            self.k_norm = LayerNorm(self.head_dim, eps=norm_eps)
        self.proj = Linear(dim, dim, bias=proj_bias)
        self.window_size = window_size  # BEiT: a learned bias per head and relative position
        if window_size is not None:  # every (dy, dx) of the grid, then the class token's three
            rows = (2 * window_size[0] - 1) * (2 * window_size[1] - 1) + 3
            self.relative_position_bias_table = np.zeros((rows, num_heads))
        self.use_rel_pos, self.input_size = use_rel_pos, input_size  # SAM: per row and column offset
        if use_rel_pos:
            self.rel_pos_h = np.zeros((2 * input_size[0] - 1, self.head_dim))
            self.rel_pos_w = np.zeros((2 * input_size[1] - 1, self.head_dim))

    def _get_rel_pos_bias(self):
        """(1, H, N, N): the table's row for each (query, key) pair's relative position, per head."""
        index = relative_position_index(self.window_size)
        return self.relative_position_bias_table[index].transpose((2, 0, 1))[None]  # one tuple: autograd traces it

    def project(self, x):
        """q, k and v, each (B, H, N, hd)."""
        B, N, C = x.shape
        if not hasattr(self, "qkv"):
            return [split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj)]
        qkv = self.qkv(x)
        if hasattr(self, "q_bias"):
            qkv = qkv + np.concatenate([self.q_bias, np.zeros_like(self.q_bias), self.v_bias])
        qkv = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).transpose((2, 0, 3, 1, 4))
        return qkv[0], qkv[1], qkv[2]

    def __call__(self, x, taps=None, name="attn", rope=None, keep=None, window=None):
        """``keep``: (B, N) the tokens that are an image's, the keys the rest attend (a packed batch's);
        ``window``: (1, 1, N, N) the keys each query attends (Qwen2.5-VL's windows)."""
        q, k, v = self.project(x)
        q = record_tap(taps, f"{name}.q", q)
        k = record_tap(taps, f"{name}.k", k)
        v = record_tap(taps, f"{name}.v", v)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
            q = record_tap(taps, f"{name}.q_norm", q)
            k = record_tap(taps, f"{name}.k_norm", k)
        if rope is not None:  # the patch tokens' q and k turned by their positions (timm's Eva)
            q = record_tap(taps, f"{name}.q_rope", rotate_tokens(q, rope, self.num_prefix_tokens, self.rotate_half))
            k = record_tap(taps, f"{name}.k_rope", rotate_tokens(k, rope, self.num_prefix_tokens, self.rotate_half))
        bias = None
        if self.window_size is not None:  # added to the scaled logits
            bias = record_tap(
                taps, f"{name}.rel_pos_bias", np.broadcast_to(self._get_rel_pos_bias(), (*q.shape[:3], q.shape[2]))
            )
        if self.use_rel_pos:  # q's products with the offsets' rows, added to the scaled logits
            bias = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, self.input_size)
            bias = record_tap(taps, f"{name}.rel_pos", bias)
        q = q * self.scale
        attn = q @ np.swapaxes(k, -2, -1)
        attn = attn if bias is None else attn + bias
        attn = attn if window is None else np.where(window, attn, -np.inf)
        attn = attn if keep is None else np.where(keep[:, None, None, :], attn, -np.inf)
        attn = softmax(attn, axis=-1)  # over keys
        attn = record_tap(taps, f"{name}.weights", attn)
        x = attn @ v
        x = merge_heads(x)  # head-major
        x = self.proj(x)
        x = record_tap(taps, name, x)
        return x


class MultiHeadAttention(Module):
    """Self- or cross-attention: queries from ``x``, keys and values from ``context``.

    Weights as timm's AttentionPoolLatent: ``q`` (H*hd, dim), ``kv`` (2*H*hd, context_dim)
    with rows ordered (2, heads, head_dim), ``proj`` (dim, H*hd).
    """

    def __init__(self, dim, context_dim=None, num_heads=8, head_dim=None, qkv_bias=True, fused_attn=False):
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
        kv = self.kv(context).reshape(B, M, 2, self.num_heads, self.head_dim).transpose((2, 0, 3, 1, 4))
        k, v = kv[0], kv[1]
        x, attn = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale)
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
        self.latent = np.zeros((1, 1, dim))
        self.norm = LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer)

    def __call__(self, x, taps=None, name="attn_pool", keep=None):
        B, N, _ = x.shape
        q = split_heads(self.q(np.broadcast_to(self.latent, (B, *self.latent.shape[1:]))), self.num_heads)
        kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).transpose((2, 0, 3, 1, 4))
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


class Mlp(Module):
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
        width = self.init_fc1(in_features, hidden_features, bias)  # what fc2 reads
        self.act = GELU(act_layer or self.default_act)
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
        if hasattr(self, "norm"):
            x = record_tap(taps, f"{name}.norm", self.norm(x))
        return record_tap(taps, name, self.fc2(x))


class SwiGLUPacked(Mlp):
    """timm's SwiGLUPacked (GluMlp, gate first): fc1 rows are the gate, then the value."""

    default_act = "silu"

    def init_fc1(self, in_features, hidden_features, bias) -> int:
        return super().init_fc1(in_features, hidden_features, bias) // 2

    def hidden(self, x):
        gate, x = np.split(self.fc1(x), 2, axis=-1)
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


class Block(Module):
    """Pre-norm block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))); two distinct norms
    (ls1, ls2: LayerScale with init_values, else identities)."""

    def __init__(self, config: ViTConfig, fused_attn: bool = False, attn_layer=None, mlp_layer=None, index: int = 0):
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
        return {"window": window_mask(grid, self.window_cut)[None, None]} if self.window_cut else {}


class RotaryEmbeddingMixed(Module):
    """timm's RoPE-Mixed: the rotation's learned frequencies, (2, depth, heads, head_dim / 2)."""

    def __init__(self, config: ViTConfig):
        self.freqs = np.zeros((2, config.depth, config.num_heads, config.head_dim // 2))


class VisionTransformer(Module):
    def __init__(
        self,
        config: ViTConfig,
        fused_attn: bool = False,
        embed_layer=None,
        block_fn=None,
        attn_layer=None,
        mlp_layer=None,
    ):
        self.config = config
        D = config.embed_dim
        self.patch_embed = (embed_layer or PatchEmbed)(config)
        if config.rope_type == "mixed":
            self.rope = RotaryEmbeddingMixed(config)
        if config.class_token:
            self.cls_token = np.zeros((1, 1, D))
        if config.reg_tokens:
            self.reg_token = np.zeros((1, config.reg_tokens, D))
        if config.pos_embed == "learn":
            self.pos_embed = np.zeros((1, config.embed_len, D))
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
            self.dist_token = np.zeros((1, 1, D))
            if config.num_classes:
                self.head_dist = Linear(D, config.num_classes)

    def _pos_embed(self, x, grid):
        B, _, D = x.shape
        tokens = [getattr(self, k) for k in ("cls_token", "dist_token", "reg_token") if hasattr(self, k)]
        prefix = [np.broadcast_to(t, (B, t.shape[1], D)) for t in tokens]  # class, distillation, registers
        learned = self.pos_embed if self.config.pos_embed == "learn" else None
        found = pos_table(self.config, learned, grid, x.shape[1] + sum(t.shape[1] for t in prefix))
        if found is None:
            return np.concatenate(prefix + [x], axis=1)
        pos, covers_prefix = found
        if covers_prefix:  # the learned table (unless no_embed_class), the sinusoid
            return np.concatenate(prefix + [x], axis=1) + pos
        return np.concatenate(prefix + [x + pos], axis=1)  # the prefix tokens join after, without a position

    def _pos_embed_packed(self, x, rows):
        """Each row of a packed batch given its prefix tokens and positions at its own grid; its
        padding as projected."""
        parts = [
            np.concatenate([self._pos_embed(x[i : i + 1, :n], grid), x[i : i + 1, n:]], axis=1)
            for i, (n, grid) in enumerate(rows)
        ]
        return np.concatenate(parts, axis=0)

    def forward_packed(self, batch, taps=None, rows=None):
        """A packed batch (NaFlex: ``patches``, ``patch_coord``, ``patch_valid``; docs/verify.md):
        each row's table at its own grid, its padding kept out of every attention and pool.
        ``rows``: each row's patch count and grid (``packed_rows``), where the coordinates cannot be read."""
        c = self.config
        x, coord, valid = (np.asarray(batch[k]) for k in ("patches", "patch_coord", "patch_valid"))
        x = self.patch_embed(x.astype(np.float64), taps, packed=True)
        x = self._pos_embed_packed(x, packed_rows(coord, valid) if rows is None else rows)
        keep = np.concatenate([np.ones((len(x), c.num_prefix_tokens), bool), valid.astype(bool)], axis=1)
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
            self.config, grid, self.rope.freqs if hasattr(self, "rope") else None
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
            mean, top = (x * w).sum(axis=1) / w.sum(axis=1), np.where(w, x, -np.inf).max(axis=1)
        else:
            mean, top = x.mean(axis=1), (x.max(axis=1) if pool != "avg" else None)
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
            check_images(x.shape, str(x.dtype), self.config)
            x = self.forward_head(self.forward_features(x.astype(np.float64), taps), taps)
        return taps if return_taps else x


# ----------------------------------------------------------------------------- loading


def load_state_dict(model: Module, native: dict[str, np.ndarray]) -> None:
    """Strict: every parameter present, nothing extra, every shape equal."""
    current = dict(model.named_parameters())
    check_exact_match({k: v.shape for k, v in current.items()}, {k: np.shape(v) for k, v in native.items()})
    for key, value in native.items():
        model.set_parameter(key, np.asarray(value, dtype=np.float64))


def make(
    config: ViTConfig,
    state: dict[str, np.ndarray],
    *,
    taps: bool = True,
    fused_attn: bool = False,
    model_cls=None,
    **layers,
):
    """Port factory: canonical float32 state -> forward(images) on NumPy arrays.

    ``model_cls`` and ``layers`` (embed_layer, block_fn, attn_layer, mlp_layer) swap in other
    module classes, as timm's VisionTransformer allows.
    """
    validate_state(state, config)
    model = (model_cls or VisionTransformer)(config, fused_attn, **layers)
    load_state_dict(model, to_native(state, FRAMEWORK))

    def forward(images: np.ndarray):
        return model(images if isinstance(images, Mapping) else np.asarray(images), return_taps=taps)

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

    def forward(x, context=None, mask=None):
        context = None if context is None else np.asarray(context, np.float64)
        return model(np.asarray(x, np.float64), context, mask, return_weights=True)

    return forward


# ----------------------------------------------------------------------------- gradients


def loss_value(logits, loss: Loss):
    """The loss of the logits (impls.protocol.Loss), in this file's NumPy."""
    if loss.kind == "linear":
        return np.sum(logits * loss.weights)
    m = np.max(logits, axis=-1, keepdims=True)
    log_softmax = logits - m - np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True))
    return -np.mean(log_softmax[np.arange(logits.shape[0]), loss.labels])


@lru_cache(maxsize=2)
def _traced(name: str = "impls._numpy_vit_traced"):
    """This file executed again with ``np`` and ``erf`` bound to autograd's (HIPS/autograd), so
    the oracle's own float64 forward, unchanged, is differentiated in reverse mode. (Another
    ``name`` is another copy: conformance.numerics.gradients perturbs one's softmax backward.)"""
    import autograd.numpy as anp
    from autograd.extend import defvjp, primitive

    # autograd.scipy.special's erf, as it defines it (importing that module imports scipy.stats
    # and scipy.integrate: most of a gradient check's start-up)
    aerf = primitive(erf)
    defvjp(aerf, lambda ans, x: lambda g: 2.0 * g * 0.56418958354775627928 * anp.exp(-(x**2)))

    spec = importlib.util.spec_from_file_location(name, __file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.np, module.erf = anp, aerf
    # and the position schemes' file, so that every table's resampling and rotation is differentiated too
    spec = importlib.util.spec_from_file_location(f"{name}_pos_embed", Path(__file__).with_name("numpy_pos_embed.py"))
    positions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(positions)
    positions.np = anp
    for scheme in ("pos_table", "rope_tables", "rotate_tokens"):  # what the model calls
        setattr(module, scheme, getattr(positions, scheme))
    return module


def make_grad(config: ViTConfig, state: dict[str, np.ndarray], *, fused_attn: bool = False, model_cls=None, **layers):
    """Gradient factory, the float64 reference: canonical state -> grad(images, loss) returning
    {"loss": float, "params": {canonical key: dL/dparam}, "images": dL/dimages, "taps": {tap:
    dL/d(stage output)}}. ``grad(..., perturbed=...)`` builds the taps from the zeros added at
    each tap (impls.Perturbed by default; conformance.numerics.gradients propagates rounding that way)."""
    from autograd import value_and_grad

    validate_state(state, config)
    traced = _traced()
    model = (model_cls or traced.VisionTransformer)(config, fused_attn, **layers)
    native = to_native(state, FRAMEWORK)  # float64
    check_exact_match({k: v.shape for k, v in model.named_parameters()}, {k: v.shape for k, v in native.items()})
    used: list[str] = []

    def objective(params, images, zeros, loss, perturbed):
        for key, value in params.items():
            model.set_parameter(key, value)
        taps = perturbed(zeros)
        # Below __call__ (its check wants float32 images): the gradient stays in float64.
        value = traced.loss_value(model.forward_head(model.forward_features(images, taps), taps), loss)
        used[:] = taps.used
        return value

    differentiate = value_and_grad(objective, argnum=(0, 1, 2))

    def grad(images: np.ndarray, loss: Loss, perturbed=Perturbed):
        images = np.asarray(images)
        check_images(images.shape, str(images.dtype), config)
        images = images.astype(np.float64)
        zeros = {k: np.zeros(shape) for k, shape in tap_shapes(config, len(images), images.shape[-2:]).items()}
        value, (g_params, g_images, g_taps) = differentiate(native, images, zeros, loss, perturbed)
        # The oracle's layout is the canonical one; from_native would round to float32.
        return {
            "loss": float(value),
            "params": dict(g_params),
            "images": g_images,
            "taps": {k: g_taps[k] for k in used},
        }

    return grad


def adamw_step(config: ViTConfig, state: dict[str, np.ndarray], images, loss: Loss, hp: AdamW, **options):
    """One AdamW step from zero moments (step 1), in float64, written as torch.optim.AdamW
    defines it: the reference gradient, then the decoupled decay and the bias-corrected update.
    Returns the new canonical state (float64) and the gradients it used."""
    grads = make_grad(config, state, **options)(images, loss)
    (b1, b2), t = hp.betas, 1
    new = {}
    for key, p in state.items():
        g, p = grads["params"][key], np.asarray(p, np.float64)
        m, v = (1 - b1) * g, (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        wd = hp.weight_decay if hp.decays(key, p.ndim) else 0.0
        new[key] = p * (1 - hp.lr * wd) - hp.lr * m_hat / (np.sqrt(v_hat) + hp.eps)
    return new, grads
