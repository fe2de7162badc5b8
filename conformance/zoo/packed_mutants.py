"""PyTorch mutants of NaFlex's packed batches (issue 43): the bugs of a port's packed path, which
verify's packed cases show (in the plugin, on drawn configs: conformance/tests/test_port_kinds.py).
Each is the PyTorch port's ``make_naflex`` with one thing changed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conformance.zoo.torch_mutants import VisionTransformerPosEmbedNoAntialias
from impls import NAFLEX_FAMILY
from impls import torch_vit as T


class AttentionPaddingAttended(T.Attention):
    """The attention without its key mask: every query attends its row's padding too."""

    def forward(self, x, taps=None, name="attn", rope=None, keep=None):
        return super().forward(x, taps, name, rope)


def naflex_padding_attended(config, state, **kw):
    return T.make(config, state, attn_layer=AttentionPaddingAttended, **kw)


class VisionTransformerGridSwapped(T.VisionTransformer):
    """Each row's grid read from its coordinates as (x, y): its table resampled to (columns, rows)."""

    def _pos_embed_packed(self, x, rows):
        return super()._pos_embed_packed(x, [(n, grid[::-1]) for n, grid in rows])


def naflex_grid_swapped(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerGridSwapped, **kw)


def naflex_pos_embed_no_antialias(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerPosEmbedNoAntialias, **kw)


class VisionTransformerAlignCorners(T.VisionTransformer):
    """Each row's table resampled with align_corners=True: the grids' corner centres on each other."""

    def _pos_embed(self, x, grid):
        c = self.config
        if c.pos_embed != "learn" or tuple(grid) == c.pos_grid:
            return super()._pos_embed(x, grid)
        n, D = 0 if c.no_embed_class else c.num_prefix_tokens, self.pos_embed.shape[-1]
        table = self.pos_embed[:, n:].reshape(1, *c.pos_grid, D).permute(0, 3, 1, 2).float()
        table = F.interpolate(table, size=tuple(grid), mode=c.pos_embed_interp_mode, antialias=True, align_corners=True)
        pos = torch.cat([self.pos_embed[:, :n], table.permute(0, 2, 3, 1).flatten(1, 2).to(x.dtype)], dim=1)
        prefix = [getattr(self, k).expand(x.shape[0], -1, -1) for k in ("cls_token", "reg_token") if hasattr(self, k)]
        if c.no_embed_class:
            return torch.cat(prefix + [x + pos], dim=1)
        return torch.cat(prefix + [x], dim=1) + pos


def naflex_pos_embed_align_corners(config, state, **kw):
    return T.make(config, state, model_cls=VisionTransformerAlignCorners, **kw)


for _packed in (
    naflex_padding_attended,
    naflex_grid_swapped,
    naflex_pos_embed_no_antialias,
    naflex_pos_embed_align_corners,
):
    _packed.supports, _packed.inputs = NAFLEX_FAMILY, "naflex"
