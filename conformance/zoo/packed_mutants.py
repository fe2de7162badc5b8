"""PyTorch mutants of NaFlex's packed batches (issue 43): the bugs of a port's packed path, which
verify's packed cases show (the plugin's properties draw images: a packed port is verify's alone).
Each is the PyTorch port's ``make_naflex`` with one thing changed."""

from __future__ import annotations

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


for _packed in (naflex_padding_attended, naflex_grid_swapped, naflex_pos_embed_no_antialias):
    _packed.supports, _packed.inputs = NAFLEX_FAMILY, "naflex"
