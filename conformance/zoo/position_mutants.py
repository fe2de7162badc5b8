"""PyTorch mutants with a position embedding of another kind in place of the learned table (issue
45): a port written from the Transformer paper (its 1-D sinusoidal encoding, seed post 004) or from
SimpleViT (its fixed 2-D sin-cos table) loading a ViT checkpoint whose table is learned. Each is the
PyTorch port with its ``_pos_embed`` changed."""

from __future__ import annotations

import math

import torch

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
