"""PyTorch mutants: bugs as they are written in PyTorch ports (the seed posts' attention and
einops ViT code, and public reports). Each is the correct port with one thing changed; the
backward mutants at the end keep its forward and break its gradient (`verify --grad`)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from einops import rearrange

from conformance.zoo.catalogue import DYNAMIC_SUPPORTS, REL_SUPPORTS, ROPE_SUPPORTS
from impls.relative_position import relative_position_index
from impls import VIT_FAMILY
from impls import torch_vit as T


class AttentionProjectsInput(T.Attention):
    """`out = self.to_out(x)`: proj applied to the block's input, the attention result dropped."""

    def forward(self, x, taps=None, name="attn"):
        inp = x
        super().forward(x, taps, name)  # computes (and taps) q, k, v, weights
        x = self.proj(inp)
        T.record_tap(taps, name, x)
        return x


def _timm_qkv(self, x):
    B, N, _ = x.shape
    return self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def _attend(self, x, qkv, taps, name, weights=None):
    """The correct attention from q, k, v on, but for ``weights(q, k)`` when given."""
    q, k, v = qkv
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        T.record_tap(taps, f"{name}.{n}", t)
    if weights is None:
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
    else:
        attn = weights(q, k)
    T.record_tap(taps, f"{name}.weights", attn)
    x = self.proj(T.merge_heads(attn @ v))
    T.record_tap(taps, name, x)
    return x


class _AttentionWeightsBy(T.Attention):
    """timm's attention but for its weights, ``self.weights(q, k)``: what each mutant below changes."""

    def forward(self, x, taps=None, name="attn"):
        return _attend(self, x, _timm_qkv(self, x), taps, name, self.weights)


class AttentionScaleAfterSoftmax(_AttentionWeightsBy):
    """`att = F.softmax(energy, dim=-1) / scaling` with scaling = sqrt(emb_size) (seed post 002)."""

    def weights(self, q, k):
        emb_size = q.shape[1] * q.shape[-1]  # heads x head_dim: the block's width
        return (q @ k.transpose(-2, -1)).softmax(dim=-1) / emb_size**0.5


class AttentionScaleByEmbedDim(T.Attention):
    """Scale by embed_dim^-0.5 instead of head_dim^-0.5 (d_model for d_k)."""

    def __init__(self, dim, *args, **kwargs):
        super().__init__(dim, *args, **kwargs)
        self.scale = dim**-0.5


class AttentionQkvHeadsFirst(T.Attention):
    """Fused qkv rows read as (heads, 3, head_dim) instead of timm's (3, heads, head_dim)."""

    def forward(self, x, taps=None, name="attn"):
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, self.num_heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        return _attend(self, x, qkv.unbind(0), taps, name)


class AttentionEinopsHdQkv(T.Attention):
    """rearrange(qkv, 'b n (h d qkv) -> qkv b h n d') from seed post 002: not timm's layout."""

    def forward(self, x, taps=None, name="attn"):
        qkv = rearrange(self.qkv(x), "b n (h d qkv) -> qkv b h n d", h=self.num_heads, qkv=3)
        return _attend(self, x, (qkv[0], qkv[1], qkv[2]), taps, name)


class AttentionFusedDropout(T.Attention):
    """dropout_p=0.1 handed to the fused kernel, which ignores eval() (pytorch/pytorch#124464)."""

    def forward(self, x, taps=None, name="attn"):
        q, k, v = _timm_qkv(self, x)
        x = self.proj(T.merge_heads(F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)))
        T.record_tap(taps, name, x)
        return x


class PatchEmbedColumnMajor(T.PatchEmbed):
    """Tokens flattened column-major: flatten over (w, h) instead of (h, w)."""

    def project(self, x, taps=None, name="patch_embed"):
        return self.proj(x).transpose(2, 3).flatten(2).transpose(1, 2)


class PatchEmbedTimesSqrtD(T.PatchEmbed):
    """Seed post 004's Transformer embedding scale: the patch tokens times √d_model."""

    def project(self, x, taps=None, name="patch_embed"):
        return super().project(x, taps, name) * self.proj.weight.shape[0] ** 0.5


class PatchEmbedRearrangeS1S2C(T.PatchEmbed):
    """Seed post 002's linear patch embedding, 'b c (h s1) (w s2) -> b (h w) (s1 s2 c)', fed the
    conv kernel flattened as (c, s1, s2): the orders disagree as soon as in_chans > 1."""

    def project(self, x, taps=None, name="patch_embed"):
        ph, pw = self.patch_size
        patches = rearrange(x, "b c (h s1) (w s2) -> b (h w) (s1 s2 c)", s1=ph, s2=pw)
        w = self.proj.weight.reshape(self.proj.weight.shape[0], -1)
        return patches @ w.T + self.proj.bias


class VisionTransformerMeanPoolsAll(T.VisionTransformer):
    """Mean pooling over every token (cls included) where timm takes the class token."""

    def forward_head(self, x, taps=None):
        x = x.mean(dim=1)
        T.record_tap(taps, "pooled", x)
        x = self.head(x)
        T.record_tap(taps, "logits", x)
        return x


class VisionTransformerClassHeadOnly(T.VisionTransformer):
    """A distilled DeiT run through its class token's head alone: the distillation head unused."""

    def forward_head_distilled(self, x, taps=None):
        x, x_dist = x[:, 0], x[:, 1]
        x = T.record_tap(taps, "pooled", x)
        T.record_tap(taps, "pooled_dist", x_dist)
        return T.record_tap(taps, "logits", self.head(x))


def layernorm_eps_1e5(config, state, **kw):
    """PyTorch's nn.LayerNorm default eps=1e-5 where timm uses 1e-6."""
    return T.make(config.replace(norm_eps=1e-5), state, **kw)


def layernorm_where_rmsnorm(config, state, **kw):
    """nn.LayerNorm(bias=False) where the model's norms are RMSNorm (AIMv2): the mean subtracted."""
    return T.make(config.replace(norm_layer="layernorm", norm_bias=False), state, **kw)


layernorm_where_rmsnorm.supports = {**VIT_FAMILY, "norm_layer": ("rmsnorm",)}  # AIMv2's norms, the rest free


attention_projects_input = partial(T.make, attn_layer=AttentionProjectsInput)
scale_after_softmax = partial(T.make, attn_layer=AttentionScaleAfterSoftmax)
scale_by_embed_dim = partial(T.make, attn_layer=AttentionScaleByEmbedDim)
qkv_heads_first = partial(T.make, attn_layer=AttentionQkvHeadsFirst)
qkv_einops_h_d_qkv = partial(T.make, attn_layer=AttentionEinopsHdQkv)
fused_attention_dropout = partial(T.make, attn_layer=AttentionFusedDropout)
tokens_column_major = partial(T.make, embed_layer=PatchEmbedColumnMajor)
patch_embed_times_sqrt_d = partial(T.make, embed_layer=PatchEmbedTimesSqrtD)
patch_linear_s1s2c = partial(T.make, embed_layer=PatchEmbedRearrangeS1S2C)
mean_pool_instead_of_cls = partial(T.make, model_cls=VisionTransformerMeanPoolsAll)
distillation_head_unused = partial(T.make, model_cls=VisionTransformerClassHeadOnly)
distillation_head_unused.supports = {"distilled": True}


# ----------------------------------------------------------------------------- attention level


class MultiHeadAttentionMaskNotAssigned(T.MultiHeadAttention):
    """`energy.masked_fill(~mask, fill)` whose result is never assigned: the mask never masks
    (seed post 002)."""

    def forward(self, x, context=None, mask=None, return_weights=False):
        return super().forward(x, context, None, return_weights)


mask_ignored = partial(T.make_attention, model_cls=MultiHeadAttentionMaskNotAssigned)


class AttentionSoftmaxOverBatch(_AttentionWeightsBy):
    """softmax(dim=0): the axis counted from the front, normalising across the batch."""

    def weights(self, q, k):
        return ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=0)


class AttentionCausal(T.Attention):
    """is_causal=True, copied from a decoder's attention into an encoder."""

    def forward(self, x, taps=None, name="attn"):
        q, k, v = _timm_qkv(self, x)
        x = self.proj(T.merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        T.record_tap(taps, name, x)
        return x


class MultiHeadAttentionCausal(T.MultiHeadAttention):
    def forward(self, x, context=None, mask=None, return_weights=False):
        causal = torch.ones(x.shape[1], (x if context is None else context).shape[1], dtype=torch.bool).tril()
        if mask is not None:
            causal = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, -torch.inf)
        return super().forward(x, context, causal, return_weights)


class MultiHeadAttentionScaleByDim(T.MultiHeadAttention):
    """Scaled by dim^-0.5 (the model width) instead of head_dim^-0.5."""

    def __init__(self, dim, *args, **kwargs):
        super().__init__(dim, *args, **kwargs)
        self.scale = dim**-0.5


class MultiHeadAttentionNaiveSoftmax(T.MultiHeadAttention):
    """A hand-written softmax, exp(l) / sum(exp(l)), without subtracting the row maximum:
    exact in real arithmetic, inf / inf = NaN in float32 once logits pass ~88."""

    def forward(self, x, context=None, mask=None, return_weights=False):
        context = x if context is None else context
        B, M, _ = context.shape
        q = T.split_heads(self.q(x), self.num_heads)
        k, v = self.kv(context).reshape(B, M, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        if mask is not None:
            logits = logits.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else logits + mask
        attn = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)
        x = self.proj(T.merge_heads(attn @ v))
        return (x, attn) if return_weights else x


softmax_over_batch = partial(T.make, attn_layer=AttentionSoftmaxOverBatch)


# ----------------------------------------------------------------------------- precision


def _naive_softmax(logits):
    return logits.exp() / logits.exp().sum(dim=-1, keepdim=True)


class AttentionNaiveSoftmax(_AttentionWeightsBy):
    """exp(l) / sum(exp(l)), without subtracting the row maximum, in the model's dtype: inf / inf
    = NaN once a logit passes 88 in float32, 11 in float16 (facebookresearch/deit#109)."""

    def weights(self, q, k):
        return _naive_softmax((q * self.scale) @ k.transpose(-2, -1))


class AttentionScaledAfterProduct(_AttentionWeightsBy):
    """(q @ k^T) * scale in float16: the unscaled product overflows (65504) before the scale
    would have brought it back into range."""

    def weights(self, q, k):
        return ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1, dtype=torch.float32).to(q.dtype)


class LayerNormStatsInInputDtype(torch.nn.LayerNorm):
    """LayerNorm written out with E[x^2] - E[x]^2 in the input's dtype: x^2 overflows float16 past
    |x| = 256 (massive activations), and the difference cancels."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class BlockLayerNormStatsInInputDtype(T.Block):
    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.norm1 = LayerNormStatsInInputDtype(config.embed_dim, eps=config.norm_eps)
        self.norm2 = LayerNormStatsInInputDtype(config.embed_dim, eps=config.norm_eps)


class VisionTransformerTokenSumInInputDtype(T.VisionTransformer):
    """Average pooling as a running sum over tokens in the model's dtype, then a division: in
    float16 each addition rounds to the sum's ulp (0.5 at 1000, 4 at 8000)."""

    def forward_head(self, x, taps=None):
        tokens = x[:, self.config.num_prefix_tokens :]
        total = tokens[:, 0]
        for i in range(1, tokens.shape[1]):
            total = total + tokens[:, i]
        x = self.fc_norm(total / tokens.shape[1])
        T.record_tap(taps, "pooled", x)
        x = self.head(x)
        T.record_tap(taps, "logits", x)
        return x


naive_softmax = partial(T.make, attn_layer=AttentionNaiveSoftmax)
scaled_after_product = partial(T.make, attn_layer=AttentionScaledAfterProduct)
layernorm_stats_in_input_dtype = partial(T.make, block_fn=BlockLayerNormStatsInInputDtype)
token_sum_in_input_dtype = partial(T.make, model_cls=VisionTransformerTokenSumInInputDtype)
mha_naive_softmax = partial(T.make_attention, model_cls=MultiHeadAttentionNaiveSoftmax)
causal_mask = partial(T.make, attn_layer=AttentionCausal)
mha_causal_mask = partial(T.make_attention, model_cls=MultiHeadAttentionCausal)
mha_scale_by_dim = partial(T.make_attention, model_cls=MultiHeadAttentionScaleByDim)


class MlpGELU(T.Mlp):
    """An MLP written with nn.GELU whatever the checkpoint was trained with."""

    def __init__(self, in_features, hidden_features, act_layer="gelu", bias=True):
        super().__init__(in_features, hidden_features, "gelu", bias)


def gelu_for_quick_gelu(config, state, **kw):
    """OpenAI CLIP weights run with GELU where they were trained with QuickGELU, x * sigmoid(1.702 x)."""
    return T.make(config, state, mlp_layer=MlpGELU, **kw)


gelu_for_quick_gelu.supports = {"act_layer": "quick_gelu", "pre_norm": (False, True)}


def resample_without_antialias(pos, old_grid, new_grid, num_prefix_tokens):
    """F.interpolate(mode="bicubic") without antialias, where timm's resample_abs_pos_embed (and
    so the checkpoint's evaluation at other sizes) uses antialias=True."""
    if tuple(new_grid) == tuple(old_grid):
        return pos
    prefix, grid = pos[:, :num_prefix_tokens], pos[:, num_prefix_tokens:]
    grid = grid.reshape(1, *old_grid, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    return torch.cat([prefix, grid.permute(0, 2, 3, 1).flatten(1, 2).to(pos.dtype)], dim=1)


class VisionTransformerPosEmbedNoAntialias(T.VisionTransformer):
    def _pos_embed(self, x, grid):
        c = self.config
        pos = resample_without_antialias(
            self.pos_embed, c.pos_grid, grid, 0 if c.no_embed_class else c.num_prefix_tokens
        )
        prefix = [
            t.expand(x.shape[0], -1, -1)
            for t in ([self.cls_token] if c.class_token else []) + ([self.reg_token] if c.reg_tokens else [])
        ]
        if c.no_embed_class:
            return torch.cat(prefix + [x + pos], dim=1)
        return torch.cat(prefix + [x], dim=1) + pos


def pos_embed_no_antialias(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerPosEmbedNoAntialias, **kw)


pos_embed_no_antialias.supports = DYNAMIC_SUPPORTS


class VisionTransformerRegistersInPatchMean(T.VisionTransformer):
    """Average pooling that skips only the class token: the register tokens are averaged in."""

    def pool(self, x, taps=None):
        if self.config.global_pool != "avg":
            return super().pool(x, taps)
        return x[:, int(self.config.class_token) :].mean(dim=1, dtype=torch.float32).to(x.dtype)


def registers_in_patch_mean(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerRegistersInPatchMean, **kw)


registers_in_patch_mean.supports = {"reg_tokens": (1, 2), "global_pool": ("avg",)}


# Backward mutants: the forward is the correct port's (every forward check passes), the gradients
# are wrong (docs/gradients.md); each a gradient factory, what `verify --grad` and --grad-port take.
# --- a frozen position embedding: `pos_embed.requires_grad = False` in a fine-tuning script, or
# a `.detach()` left from an interpolation helper; the forward is untouched.
class VisionTransformerFrozenPosEmbed(T.VisionTransformer):
    def _pos_embed(self, x, grid):
        B, _, D = x.shape
        c = self.config
        pos = T.resample_pos_embed(
            self.pos_embed.detach(), c.pos_grid, grid, 0 if c.no_embed_class else c.num_prefix_tokens
        )
        tokens = ([self.cls_token] if c.class_token else []) + ([self.reg_token] if c.reg_tokens else [])
        prefix = [t.expand(B, -1, -1) for t in tokens]
        if c.no_embed_class:
            return torch.cat(prefix + [x + pos], dim=1)
        return torch.cat(prefix + [x], dim=1) + pos


class _ExactGelu(torch.autograd.Function):
    """F.gelu exactly in the forward; each mutant below writes its own backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)


class _Applied(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function.apply(*args)


# --- a hand-written GELU whose backward keeps Phi(x) and drops x * phi(x) from
# d/dx [x Phi(x)], as in autograd.Functions written to save memory.
class _GeluHalfBackward(_ExactGelu):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1.0 + torch.erf(x * 0.5**0.5))


class MlpGeluHalfBackward(T.Mlp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.act = _Applied(_GeluHalfBackward)


# --- the same GELU with the tanh approximation's derivative in its backward (a fused
# kernel's backward written for the other GELU): the two slopes differ by up to 2e-3 where
# |x| is about 2, and agree near 0, so only the stage-wise bound sees it on ordinary weights.
class _GeluTanhBackward(_ExactGelu):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (slope,) = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)
        return grad * slope


class MlpGeluTanhBackward(T.Mlp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.act = _Applied(_GeluTanhBackward)


# --- a LayerNorm whose backward treats the mean and variance as constants (statistics taken
# through `.detach()`): dx = g w / sigma, without the mean's and the variance's terms; the
# forward is F.layer_norm exactly, and the weight's and bias's gradients are right.
class _LayerNormDetachedStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + ctx.eps)
        x_hat = (x - x.mean(-1, keepdim=True)) * rstd
        dims = tuple(range(grad.dim() - 1))
        return grad * weight * rstd, (grad * x_hat).sum(dims), grad.sum(dims), None


class LayerNormDetachedStatistics(torch.nn.LayerNorm):
    def forward(self, x):
        return _LayerNormDetachedStatistics.apply(x, self.weight, self.bias, self.eps)


class BlockNorm2DetachedStatistics(T.Block):
    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.norm2 = LayerNormDetachedStatistics(config.embed_dim, eps=config.norm_eps)


# --- a residual branch detached: `x = x + attn(...).detach()`, the attention branch trains
# nothing and passes no gradient back; the sum is the same.
class AttentionDetached(T.Attention):
    def forward(self, x, taps=None, name="attn"):
        return super().forward(x, taps, name).detach()


pos_embed_frozen = partial(T.make_grad, model_cls=VisionTransformerFrozenPosEmbed)
gelu_backward_missing_term = partial(T.make_grad, mlp_layer=MlpGeluHalfBackward)
gelu_tanh_backward = partial(T.make_grad, mlp_layer=MlpGeluTanhBackward)
layernorm_detached_statistics = partial(T.make_grad, block_fn=BlockNorm2DetachedStatistics)
attn_residual_detached = partial(T.make_grad, attn_layer=AttentionDetached)


def rope_grid_axes_swapped(config, state, **kw):
    """The rotary grid built with the other meshgrid indexing: each patch turned by its column's
    angles where the model has its row's (and back)."""
    other = "xy" if config.rope_grid_indexing == "ij" else "ij"
    return T.make(config.replace(rope_grid_indexing=other), state, **kw)


rope_grid_axes_swapped.supports = ROPE_SUPPORTS | {"rope_grid_indexing": ("xy",)}


def rope_default_temperature(config, state, **kw):
    """EVA02's and timm's default rotary base (10000) for a model trained with another (the rope
    ViTs' and DINOv3's 100)."""
    return T.make(config.replace(rope_temperature=10000.0), state, **kw)


rope_default_temperature.supports = ROPE_SUPPORTS | {"rope_temperature": (100.0,)}


def rope_pairs_as_halves(config, state, **kw):
    """The rotation's pairs taken as halves (x_i, x_{i + hd/2}: Llama's rotate_half) where the model
    pairs neighbours (x_2i, x_2i+1: timm's rope ViTs and EVA02)."""
    return T.make(config.replace(rope_rotate_half=True), state, **kw)


rope_pairs_as_halves.supports = ROPE_SUPPORTS  # rope_rotate_half left at False: the model's pairs are neighbours


class AttentionRopeSinCosSwapped(T.Attention):
    """The rotary tables' sin and cos exchanged (a [cos, sin] cache read as timm's [sin, cos])."""

    def forward(self, x, taps=None, name="attn", rope=None):
        return super().forward(x, taps, name, **({} if rope is None else {"rope": rope[::-1]}))


rope_sin_cos_swapped = partial(T.make, attn_layer=AttentionRopeSinCosSwapped)
rope_sin_cos_swapped.supports = ROPE_SUPPORTS


class AttentionQvBiasesAsQV0(T.Attention):
    """q's and v's biases joined as (q, v, 0) where timm's Eva joins (q, 0, v): k gets v's bias, v none."""

    def project(self, x):
        B, N, C = x.shape
        bias = torch.cat([self.q_bias, self.v_bias, torch.zeros_like(self.q_bias)])
        qkv = F.linear(x, self.qkv.weight, bias).reshape(B, N, 3, self.num_heads, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)


qv_biases_misplaced = partial(T.make, attn_layer=AttentionQvBiasesAsQV0)
qv_biases_misplaced.supports = ROPE_SUPPORTS | {"k_bias": (False,), "qkv_fused": (True,), "scale_mlp": (False, True)}


class AttentionRopeFromFirstToken(T.Attention):
    """The rotation applied from the sequence's first token: the class and register tokens turned by the
    first patches' angles and the last patches left as they are (``x[..., :P]`` for ``x[..., npt:]``)."""

    def forward(self, x, taps=None, name="attn", rope=None):
        npt, self.num_prefix_tokens = self.num_prefix_tokens, 0
        try:
            return super().forward(x, taps, name, **({} if rope is None else {"rope": _padded(rope, npt)}))
        finally:
            self.num_prefix_tokens = npt


def _padded(rope, npt):
    """The tables over every token: the patches' first, the prefix's count of rows of no rotation after."""
    sin, cos = rope
    pad = (*sin.shape[:-2], npt, sin.shape[-1])
    return torch.cat([sin, sin.new_zeros(pad)], -2), torch.cat([cos, cos.new_ones(pad)], -2)


rope_from_first_token = partial(T.make, attn_layer=AttentionRopeFromFirstToken)
rope_from_first_token.supports = ROPE_SUPPORTS | {"class_token": True}


class AttentionRelPosIndexTransposed(T.Attention):
    """BEiT's bias read through the transposed index: key minus query, the class rows exchanged."""

    def _get_rel_pos_bias(self):
        index = torch.from_numpy(relative_position_index(self.window_size).T.copy())
        return self.relative_position_bias_table[index].permute(2, 0, 1).unsqueeze(0)


rel_pos_index_transposed = partial(T.make, attn_layer=AttentionRelPosIndexTransposed)
rel_pos_index_transposed.supports = REL_SUPPORTS
