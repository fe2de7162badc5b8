"""lucidrains' vit-pytorch blocks, unmodified: its ``Transformer`` keeps each block as an
``nn.ModuleList([Attention, FeedForward])`` whose residuals the parent adds, with an explicit
``nn.Softmax`` module and LayerNorm's default eps (1e-5), q, k, v without bias. The patch
embedding, tokens and head around it are timm's (vit-pytorch's own ViT normalises the raw
patches, which no option expresses yet)."""

import torch
from torch import nn
from vit_pytorch.vit import Transformer

from conformance.capture import ModelPort


class ViT(nn.Module):
    def __init__(self, c):
        super().__init__()
        D = c.embed_dim
        self.patch = nn.Conv2d(c.in_chans, D, c.patch_size, stride=c.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, D))
        self.pos = nn.Parameter(torch.zeros(1, c.num_tokens, D))
        self.transformer = Transformer(D, c.depth, c.num_heads, c.head_dim, c.mlp_hidden_dim)
        self.head = nn.Linear(D, c.num_classes)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.transformer(x)[:, 0])


RENAME = {
    "patch_embed.proj": "patch",
    "cls_token": "cls",
    "pos_embed": "pos",
    "blocks.{i}.norm1": "transformer.layers.{i}.0.norm",
    "blocks.{i}.attn.qkv": "transformer.layers.{i}.0.to_qkv",
    "blocks.{i}.attn.proj": "transformer.layers.{i}.0.to_out.0",
    "blocks.{i}.norm2": "transformer.layers.{i}.1.net.0",
    "blocks.{i}.mlp.fc1": "transformer.layers.{i}.1.net.1",
    "blocks.{i}.mlp.fc2": "transformer.layers.{i}.1.net.4",
    "norm": "transformer.norm",  # not the blocks' norms the entries above wrote
}
SUPPORTS = {"qkv_bias": (False,), "norm_eps": (1e-5,), "global_pool": "token", "act_layer": "gelu"}
port = ModelPort(ViT, rename=RENAME, supports=SUPPORTS)


def _scaled_twice(c):
    model = ViT(c)
    model.transformer.layers[0][0].scale = c.head_dim**-0.5 * 2  # the classic scale bug, in block 0
    return model


scale_bug_port = ModelPort(_scaled_twice, rename=RENAME, supports=SUPPORTS)
