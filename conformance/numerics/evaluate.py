"""A stage evaluated in float64 from its inputs, with its unit bound: the stage table's kinds
(``conformance.numerics.kinds``) composed into the ViT's stages."""

from __future__ import annotations

import math
from collections.abc import Mapping
import numpy as np
from impls import numpy_vit as O
from impls.numpy_pos_embed import FIXED, FIXED_ANGLES
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind, stage_of  # noqa: F401 - re-exported
from impls.protocol import ViTConfig
from impls.relative_position import relative_position_index
from impls.windows import window_mask
from weights.resample import aa_matrix
from conformance.numerics.kinds.activation import gated, gelu
from conformance.numerics.kinds.attention import attend, decomposed_rel_pos, softmax_weights
from conformance.numerics.kinds.layer_norm import layer_norm, model_norm
from conformance.numerics.kinds.linear import linear, propagate_linear
from conformance.numerics.kinds.rotary import rotary
from conformance.numerics.precision import rounded
from conformance.numerics.roundings import Precision
from weights.canonical import qkv_parts

# ----------------------------------------------------------------------------- stages


def prefix_tokens(s, batch: int) -> list:
    """The class token, the distillation token, then the registers, each broadcast over the batch
    (those the state has)."""
    keys = ("cls_token", "dist_token", "reg_token")
    return [np.broadcast_to(s[k], (batch, *s[k].shape[1:])) for k in keys if k in s]


def _prev(i: int, config: ViTConfig) -> str:
    if i:
        return f"blocks.{i - 1}"
    return "norm_pre" if config.pre_norm else "embed"


def _features(config: ViTConfig) -> str:
    """The tokens the head pools: after the final norm, or the last block's where fc_norm replaces it."""
    return "norm" if config.use_final_norm else f"blocks.{config.depth - 1}"


def _heads(y, num_heads: int):
    if np.ndim(y) == 0:  # a bound not computed (``Precision.bounds``)
        return y
    B, N, _ = y.shape
    return y.reshape(B, N, num_heads, -1).transpose(0, 2, 1, 3)


def _rows(s, key: str, rows: slice):
    """Rows of a weight (and of its bias, if the checkpoint has one)."""
    bias = s.get(f"{key}.bias")
    return s[f"{key}.weight"][rows], None if bias is None else bias[rows]


def _mlp_act(x, s, prefix: str, config: ViTConfig, p: Precision, mlp_layer: str = "mlp"):
    """The MLP's activation (fc2's input) from its input x: act(fc1 x), or SwiGLU's act(gate) * value."""
    act = config.act_layer
    if mlp_layer == "mlp":
        h, dh = linear(x, *_rows(s, f"{prefix}.fc1", slice(None)), p)
        return gelu(h, dh, p, act)
    if mlp_layer == "swiglu":
        (g, dg), (v, dv) = (linear(x, *_rows(s, f"{prefix}.{fc}", slice(None)), p) for fc in ("fc1_g", "fc1_x"))
    else:  # swiglu_packed: fc1's rows are the gate, then the value
        half = config.mlp_hidden_dim // 2
        (g, dg), (v, dv) = (
            linear(x, *_rows(s, f"{prefix}.fc1", rows), p) for rows in (slice(0, half), slice(half, None))
        )
    return gated(g, dg, v, dv, p, act)


def mlp_hidden(name: str, t: Mapping[str, np.ndarray], s, config: ViTConfig, dtype: str = "float64"):
    """fc1's output in float64, the activation's input, at a plain MLP's ``mlp.act`` stage from its
    inputs ``t``, its input, weight and bias rounded to ``dtype`` as a port's Linear reads them (an
    autocast Linear casts a float32 input) (None at any other stage)."""
    if stage_kind(name) != "mlp.act" or (config.mlp_layer != "mlp" and not name.startswith("attn_pool.")):
        return None
    x = rounded(t[stage_inputs(name, config)[0]], dtype)
    w, bias = (None if v is None else rounded(v, dtype) for v in _rows(s, f"{name[: -len('.act')]}.fc1", slice(None)))
    return linear(x, w, bias, Precision(bounds=False))[0]


def _scaled(x, gamma, p: Precision):
    """LayerScale: x * gamma, one rounding."""
    y = x * gamma
    return y, p.output * np.abs(y)


def _resampled_pos_embed(pos, config: ViTConfig, images, p: Precision):
    """The position embedding at the images' grid (dynamic_img_size) and its bound: two
    separable passes of the antialiased bicubic (or bilinear), each a contraction over a few taps with
    weights of both signs, in float32, then stored. The weights themselves are computed in
    float32 by torch (ATen's aa kernel): each is off by up to about u (n_in + 4) absolute, as
    the source position scale (i + 0.5) is rounded (measured: 15.5 u for 16 -> 37)."""
    grid, table = config.grid_at(images.shape[2:]), config.pos_grid
    if grid == table:
        return pos, 0.0
    n = 0 if config.no_embed_class else config.num_prefix_tokens
    new = O.resample_pos_embed(pos, table, grid, n, config.pos_embed_interp_mode)
    if not p.bounds:
        return new, 0.0
    Rh, Rw = (np.abs(aa_matrix(o, g, config.pos_embed_interp_mode)) for o, g in zip(table, grid))
    g = np.abs(pos[:, n:]).reshape(pos.shape[0], *table, pos.shape[-1])
    flat = (pos.shape[0], -1, pos.shape[-1])
    m = np.einsum("ih,bhwd,jw->bijd", Rh, g, Rw).reshape(flat)
    m_h = np.einsum("ih,bhwd,jw->bijd", (Rh > 0).astype(float), g, Rw).reshape(flat)  # weight errors along h
    m_w = np.einsum("ih,bhwd,jw->bijd", Rh, g, (Rw > 0).astype(float)).reshape(flat)
    taps = math.sqrt(np.count_nonzero(Rh, 1).max()) + math.sqrt(np.count_nonzero(Rw, 1).max())
    (oh, ow) = table
    stored = 0.0 if p.dtype in ("float32", "float64") else p.storage  # the table held in a lower dtype
    bound = (
        p.compute * (taps + 1.0) * m
        + p.compute * ((oh + 4) * m_h + (ow + 4) * m_w)
        + stored * m
        + p.storage * np.abs(new[:, n:])
    )
    return new, np.concatenate([np.zeros_like(pos[:, :n]), bound], 1)


def _unlearned_pos_embed(x, s, config: ViTConfig, images, p: Precision):
    """The patches plus a fixed table (impls.numpy_pos_embed.FIXED), or nothing, the prefix tokens
    before them as stored (or in the table, where it covers them). The table is computed in
    float32: w_i from a division, a power and a reciprocal, the angle a product (about 4 u |angle|
    together), sin and cos each rounded (u), then stored in the dtype."""
    prefix = prefix_tokens(s, x.shape[0])
    stored = [p.storage * np.abs(a) for a in prefix]
    if config.pos_embed == "none":
        return np.concatenate(prefix + [x], 1), np.concatenate(stored + [p.output * np.abs(x)], 1)
    covers_prefix, table = FIXED[config.pos_embed]
    tokens = np.concatenate(prefix + [x], 1) if covers_prefix else x
    n, grid = tokens.shape[1], config.grid_at(images.shape[2:])
    pos = table(n, grid, config.embed_dim)
    y, bound = _sum(tokens, pos, p)
    angles = FIXED_ANGLES[config.pos_embed](n, grid, config.embed_dim)[None]
    bound = bound + p.compute * (4.0 * np.abs(angles) + 1.0) + p.storage * np.abs(pos)
    if covers_prefix:
        return y, bound
    return np.concatenate(prefix + [y], 1), np.concatenate(stored + [bound], 1)


def _distilled_logits(t, s, config: ViTConfig, p: Precision):
    """The mean of the class token's and the distillation token's heads (or of the two tokens,
    headless): each head's bound, halved, and the sum's rounding (the halving is exact)."""
    if config.num_classes:
        (a, da), (b, db) = (
            linear(t["pooled"], s["head.weight"], s.get("head.bias", 0.0), p),
            linear(t["pooled_dist"], s["head_dist.weight"], s.get("head_dist.bias", 0.0), p),
        )
    else:
        (a, b) = t["pooled"], t["pooled_dist"]
        da, db = p.inputs * np.abs(a), p.inputs * np.abs(b)
    y = (a + b) / 2
    return y, (da + db) / 2 + p.output * np.abs(y)


def _sum(a, b, p: Precision):
    """a + b, a a tap the port may have held more precisely than it emits (one rounding of it)."""
    y = a + b
    return y, p.output * (np.abs(a) + np.abs(b)) + p.inputs * np.abs(a)


def _pool(x, config: ViTConfig, p: Precision):
    """avg, max or avgmax over the tokens (axis 1): mean accumulated in float32, max exact."""
    mean = x.mean(1)
    dmean = p.compute * math.sqrt(x.shape[1]) * np.sqrt((x * x).mean(1)) + p.output * np.abs(mean)
    if config.global_pool == "avg":
        return mean, dmean
    top = x.max(1)
    if config.global_pool == "max":
        return top, np.zeros_like(top)
    y = 0.5 * (top + mean)
    return y, 0.5 * dmean + p.output * (np.abs(top) + np.abs(y))


def evaluate(
    name: str,
    t: Mapping[str, np.ndarray],
    images: np.ndarray,
    s: Mapping[str, np.ndarray],
    config: ViTConfig,
    p: Precision,
):
    """(oracle value, unit bound) of stage ``name`` from its inputs ``t`` (float64): the table's
    operation where stages share one (``Stage.op``), else the stage's own."""
    stage, i = stage_of(name)
    if stage.op in ("norm", "layer_norm"):
        scope = f"blocks.{i}." if i is not None else "attn_pool." if stage.scope == "attn_pool" else ""
        w, b = (f"{scope}{stage.params[0]}.{leaf}" for leaf in ("weight", "bias"))
        norm = model_norm(config) if stage.op == "norm" else layer_norm
        return norm(t[stage_inputs(name, config)[0]], s[w], s.get(b, 0.0), config.norm_eps, p)
    if name.startswith("blocks."):
        grid = config.grid_at(images.shape[2:])
        return _block_stage(name, t, s, config, p, grid, images.shape[0])
    return _model_stage(name, t, images, s, config, p)


def _model_stage(name: str, t, images: np.ndarray, s, config: ViTConfig, p: Precision):
    """The stages outside the blocks: the embedding, the final norm, the pooling, the head."""
    eps = config.norm_eps
    if name == "patch_embed.patch_norm":  # the images rounded to the dtype, then normalised
        patches = O.to_patches(images, config.patch_size)
        w, b = s["patch_embed.patch_norm.weight"], s.get("patch_embed.patch_norm.bias", 0.0)
        return model_norm(config)(patches, w, b, eps, p, dx=p.storage * np.abs(patches))
    if name == "patch_embed":
        w = s["patch_embed.proj.weight"]
        patches = t["patch_embed.patch_norm"] if config.patch_norm else O.to_patches(images, config.patch_size)
        return linear(patches, w.reshape(w.shape[0], -1), s.get("patch_embed.proj.bias"), p)
    if name == "embed" and config.pos_embed != "learn":
        return _unlearned_pos_embed(t[stage_inputs(name, config)[0]], s, config, images, p)
    if name == "embed":
        x = t[stage_inputs(name, config)[0]]
        pos, dpos = _resampled_pos_embed(s["pos_embed"], config, images, p)
        prefix = prefix_tokens(s, x.shape[0])
        if config.no_embed_class:  # the prefix tokens pass as stored: one rounding to the dtype
            y, bound = _sum(x, pos, p)
            bound = bound + dpos
            return np.concatenate(prefix + [y], 1), np.concatenate([p.storage * np.abs(a) for a in prefix] + [bound], 1)
        y, bound = _sum(np.concatenate(prefix + [x], 1), pos, p)
        return y, bound + dpos
    if name.startswith("attn_pool"):
        return _attn_pool(name, t, images.shape[0], s, config, p)
    if name == "pooled":
        if config.global_pool == "map":
            x = t["attn_pool"]
            y, dy = x, p.storage * np.abs(x)
        elif config.global_pool == "token":
            y = t[_features(config)][:, 0]
            dy = p.inputs * np.abs(y)
        else:
            start = 0 if config.pool_include_prefix else config.num_prefix_tokens
            y, dy = _pool(t[_features(config)][:, start:], config, p)
        if not config.use_fc_norm:
            return y, dy + p.output * np.abs(y)
        return model_norm(config)(y, s["fc_norm.weight"], s.get("fc_norm.bias", 0.0), eps, p, dx=dy)
    if name == "pooled_dist":
        y = t[_features(config)][:, 1]
        return y, p.inputs * np.abs(y)
    if name == "logits" and config.distilled:
        return _distilled_logits(t, s, config, p)
    if name == "logits":
        if not config.num_classes:
            return t["pooled"], p.storage * np.abs(t["pooled"])
        return linear(t["pooled"], s["head.weight"], s.get("head.bias", 0.0), p)
    raise KeyError(f"no error model for stage {name!r}")


def _block_stage(name: str, t, s, config: ViTConfig, p: Precision, grid, batch: int):
    """A stage of block i, from its inputs (``stage_inputs``), at the images' ``grid``."""
    eps, H, hd = config.norm_eps, config.num_heads, config.head_dim
    _, i, *rest = name.split(".", 2)
    b, rest = f"blocks.{i}", (rest[0] if rest else "")
    inputs = [t.get(k) for k in stage_inputs(name, config)]
    w = config.block_window(int(i))  # SAM: the attention's stages in windows, the rest on the grid
    if rest in ("attn.q", "attn.k", "attn.v"):
        x = O.window_partition(inputs[0], grid, w) if w else inputs[0]
        y, bound = linear(x, *qkv_parts(s, f"{b}.attn", config.embed_dim)["qkv".index(rest[-1])], p)
        return _heads(y, H), _heads(bound, H)
    if rest == "attn.rel_pos":
        rows, cols = s[f"{b}.attn.rel_pos_h"], s[f"{b}.attn.rel_pos_w"]
        return decomposed_rel_pos(inputs[0], rows, cols, config.rel_pos_grid(int(i)), p)
    inputs = on_grid(name, inputs, config, grid)
    if rest in ("attn.q_rope", "attn.k_rope"):
        freqs = s.get("rope.freqs")  # RoPE-Mixed's, per block
        return rotary(inputs[0], grid, config, p, None if freqs is None else freqs[:, int(i) : int(i) + 1])
    if rest == "attn.rel_pos_bias":  # a gather of the table as the port holds it: its one rounding
        table = s[f"{b}.attn.relative_position_bias_table"]
        y = np.broadcast_to(
            table[relative_position_index(grid)].transpose(2, 0, 1), (batch, H, *[grid[0] * grid[1] + 1] * 2)
        )
        return y, p.storage * np.abs(y)
    if rest == "attn.weights":  # BEiT's bias (a tap) added to the scaled logits
        mask, cut = inputs[2] if len(inputs) > 2 else None, config.block_window_cut(int(i))
        if cut:  # Qwen2.5-VL's windows: each query's own window's keys
            window = window_mask(grid, cut)
            mask = window if mask is None else np.where(window, mask, -np.inf)
        return softmax_weights(inputs[0], inputs[1], hd**-0.5, p, mask=mask)
    if rest == "attn":
        return attend_and_project(inputs[0], inputs[1], s, f"{b}.attn.proj", p)
    if rest in ("ls1", "ls2"):
        return _scaled(inputs[0], s[f"{b}.{rest}.gamma"], p)
    # A summand may enter the residual more precisely than its tap shows (XLA fuses x + h * gamma
    # into one loop; a port computing in float64 emits float32 taps): its tap's rounding,
    # u |attn| and u |mlp|, is then a difference too.
    if rest == "norm2":
        r = inputs[0] + inputs[1]
        dx = p.output * np.abs(r) + p.inputs * np.abs(inputs[1])
        return model_norm(config)(r, s[f"{b}.norm2.weight"], s.get(f"{b}.norm2.bias", 0.0), eps, p, dx=dx)
    if rest == "mlp.act":
        return _mlp_act(inputs[0], s, f"{b}.mlp", config, p, config.mlp_layer)
    if rest == "mlp":
        return linear(inputs[0], *_rows(s, f"{b}.mlp.fc2", slice(None)), p)
    if rest == "":
        r = inputs[0] + inputs[1]
        y = r + inputs[2]
        return y, p.output * (np.abs(r) + np.abs(y)) + p.inputs * (np.abs(inputs[1]) + np.abs(inputs[2]))
    raise KeyError(f"no error model for stage {name!r}")


def on_grid(name: str, inputs: list, config: ViTConfig, grid) -> list:
    """A residual stage's summands (``stage_inputs``: the stream, the attention's branch, ...) with
    a windowed block's attention branch back on the ``grid`` (a permutation: no rounding)."""
    stage, i = stage_of(name)
    w = config.block_window(i) if i is not None else 0
    if not w or stage.kind not in ("norm2", "block"):
        return inputs
    return [inputs[0], O.window_unpartition(inputs[1], grid, w), *inputs[2:]]


def attend_and_project(P, v, s, proj: str, p: Precision):
    """proj(merge_heads(P v)), with the attention output's own error carried through proj."""
    o, do = attend(P, None, v, p)
    w, bias = _rows(s, proj, slice(None))
    y, bound = linear(O.merge_heads(o), w, bias, p)
    return y, (bound + propagate_linear(O.merge_heads(do), w)) if p.bounds else 0.0


def _attn_pool(name: str, t, batch: int, s, config: ViTConfig, p: Precision):
    """timm's AttentionPoolLatent: the latent's query over the patch tokens (and the prefix with
    pool_include_prefix), then x + mlp(norm(x))."""
    H, D = config.pool_num_heads, config.embed_dim
    stage = name[len("attn_pool.") :] if name != "attn_pool" else ""
    if stage == "q":
        latent = np.broadcast_to(s["attn_pool.latent"], (batch, 1, D))
        y, bound = linear(latent, *_rows(s, "attn_pool.q", slice(None)), p)
        return _heads(y, H), _heads(bound, H)
    if stage in ("k", "v"):
        x = t[_features(config)][:, config.pool_skip :]
        rows = slice(0, D) if stage == "k" else slice(D, 2 * D)
        y, bound = linear(x, *_rows(s, "attn_pool.kv", rows), p)
        return _heads(y, H), _heads(bound, H)
    if stage == "weights":
        return softmax_weights(t["attn_pool.q"], t["attn_pool.k"], (D // H) ** -0.5, p)
    if stage == "proj":
        return attend_and_project(t["attn_pool.weights"], t["attn_pool.v"], s, "attn_pool.proj", p)
    if stage == "mlp.act":
        return _mlp_act(t["attn_pool.norm"], s, "attn_pool.mlp", config, p)
    if stage == "mlp":
        return linear(t["attn_pool.mlp.act"], *_rows(s, "attn_pool.mlp.fc2", slice(None)), p)
    y, bound = _sum(t["attn_pool.proj"], t["attn_pool.mlp"], p)
    return y[:, 0], bound[:, 0]
