"""PyTorch mutants with a position embedding of another kind in place of the learned table (issue
45): a port written from the Transformer paper (its 1-D sinusoidal encoding, seed post 004) or from
SimpleViT (its fixed 2-D sin-cos table) loading a ViT checkpoint whose table is learned, each the
PyTorch port with its ``_pos_embed`` changed; and the windows' and relative positions' (issue 60):
SAM's offsets read backwards, Qwen2.5-VL's windows never applied."""

from __future__ import annotations

import math
from functools import partial

import torch

from conformance.zoo.catalogue import DYNAMIC_SUPPORTS
from impls import VIT_FAMILY
from impls import torch_vit as T


class VisionTransformerSinusoid1D(T.VisionTransformer):
    """The Annotated Transformer's PositionalEncoding over the sequence, prefix tokens included."""

    def _pos_embed(self, x, grid):
        tokens = [getattr(self, k) for k in ("cls_token", "dist_token", "reg_token") if hasattr(self, k)]
        x = torch.cat([t.expand(x.shape[0], -1, -1) for t in tokens] + [x], dim=1)
        n, d = x.shape[1], x.shape[2]
        position = torch.arange(n, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        pe = torch.zeros(n, d)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term[: d // 2])
        return x + pe.to(x.dtype)


def pos_embed_sinusoid_1d(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerSinusoid1D, **kw)


def pos_embed_sincos_2d(config, state, **kw):
    """SimpleViT's fixed table computed at the grid, the checkpoint's learned one left unread."""
    kept = {k: v for k, v in state.items() if k != "pos_embed"}
    return T.make(config.replace(pos_embed="sincos"), kept, **kw)


class VisionTransformerSincosMAE(T.VisionTransformer):
    """MAE's get_2d_sincos_pos_embed computed at the grid (its class token's entry zero)."""

    def _pos_embed(self, x, grid):
        d = x.shape[-1]
        omega = 1.0 / 10000.0 ** (torch.arange(d // 4, dtype=torch.float64) / (d / 4.0))
        rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")

        def one_axis(pos):
            out = pos.reshape(-1, 1).double() * omega
            return torch.cat([torch.sin(out), torch.cos(out)], dim=1)

        table = torch.cat([one_axis(cols), one_axis(rows)], dim=1).float()  # MAE's meshgrid: w first
        tokens = [getattr(self, k) for k in ("cls_token", "dist_token", "reg_token") if hasattr(self, k)]
        return torch.cat([t.expand(x.shape[0], -1, -1) for t in tokens] + [x + table.to(x.dtype)], dim=1)


def pos_embed_sincos_mae(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerSincosMAE, **kw)


class VisionTransformerTableCropped(T.VisionTransformer):
    """A table of a larger grid cropped to the images' grid at its top left (`pos_embed[:, :, :gh, :gw]`)."""

    def _pos_embed(self, x, grid):
        c = self.config
        (gh, gw), n = c.pos_grid, 0 if c.no_embed_class else c.num_prefix_tokens
        if tuple(grid) == (gh, gw) or grid[0] > gh or grid[1] > gw:
            return super()._pos_embed(x, grid)
        table = self.pos_embed[:, n:].reshape(1, gh, gw, -1)[:, : grid[0], : grid[1]].flatten(1, 2)
        pos = torch.cat([self.pos_embed[:, :n], table], dim=1)
        tokens = [getattr(self, k).expand(x.shape[0], -1, -1) for k in ("cls_token", "reg_token") if hasattr(self, k)]
        return torch.cat(tokens + [x + pos], dim=1) if c.no_embed_class else torch.cat(tokens + [x], dim=1) + pos


def pos_embed_table_cropped(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerTableCropped, **kw)


pos_embed_table_cropped.supports = DYNAMIC_SUPPORTS


def rel_pos_key_minus_query(config, state, **kw):
    """SAM's decomposed relative positions read at the key's position minus the query's (timm's
    get_rel_pos with k_coords - q_coords): row j - i + S - 1 of each table, its rows in reverse."""
    flipped = {k: v[::-1].copy() if k.endswith(("attn.rel_pos_h", "attn.rel_pos_w")) else v for k, v in state.items()}
    return T.make(config, flipped, **kw)


# SAM's blocks: no prefix token, the config's own grid, no other position scheme in the attention
rel_pos_key_minus_query.supports = {
    **VIT_FAMILY,
    **dict(use_rel_pos=(True,), class_token=(False,), reg_tokens=(0,), distilled=(False,), rope_type=(None,)),
    **dict(rel_pos_bias=(False,), dynamic_img_size=(False,), global_pool=("avg", "max", "avgmax", "map")),
}


class AttentionWindowsIgnored(T.Attention):
    """Qwen2.5-VL's windows never applied: every block given the whole image's cu_seqlens (its
    cu_window_seqlens unused), each token attending over the whole image."""

    def forward(self, x, taps=None, name="attn", rope=None, keep=None, window=None):
        return super().forward(x, taps, name, rope, keep)


windows_ignored = partial(T.make, attn_layer=AttentionWindowsIgnored)
# Qwen2.5-VL's blocks: windows cut at the edge, no prefix token, no other relative position
windows_ignored.supports = {
    **VIT_FAMILY,
    **dict(window_partition=("truncate",), window_size=(2, 3, 4)),
    **dict(class_token=(False,), reg_tokens=(0,), distilled=(False,), rel_pos_bias=(False,), use_rel_pos=(False,)),
    **dict(global_pool=("avg", "max", "avgmax", "map")),
}
