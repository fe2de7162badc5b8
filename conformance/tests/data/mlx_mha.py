"""An MLX ViT built on mlx.nn.MultiHeadAttention (query_proj, key_proj, value_proj, out_proj; it calls
mx.fast.scaled_dot_product_attention), loaded with a convert that splits timm's fused qkv as MLX
conversion scripts do. Import it with this directory on sys.path."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from conformance.capture import ModelPort


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.embed_dim, eps=c.norm_eps), nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.attn = nn.MultiHeadAttention(c.embed_dim, c.num_heads, bias=True)
        self.fc1, self.fc2 = nn.Linear(c.embed_dim, c.mlp_hidden_dim), nn.Linear(c.mlp_hidden_dim, c.embed_dim)

    def __call__(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h)
        return x + self.fc2(nn.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.patch_embed = nn.Conv2d(c.in_chans, c.embed_dim, c.patch_size, stride=c.patch_size)
        self.cls_token, self.pos_embed = mx.zeros((1, 1, c.embed_dim)), mx.zeros((1, c.num_tokens, c.embed_dim))
        self.blocks = [Block(c) for _ in range(c.depth)]
        self.norm, self.head = nn.LayerNorm(c.embed_dim, eps=c.norm_eps), nn.Linear(c.embed_dim, c.num_classes)

    def __call__(self, images):
        x = self.patch_embed(images.transpose(0, 2, 3, 1))
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = mx.concatenate([mx.broadcast_to(self.cls_token, (x.shape[0], 1, x.shape[2])), x], axis=1) + self.pos_embed
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def convert(state):
    out = {}
    for k, v in state.items():
        k2 = k.replace("patch_embed.proj", "patch_embed").replace("mlp.", "")
        if k2 == "patch_embed.weight":
            v = v.transpose(0, 2, 3, 1)
        if ".attn.qkv." in k:
            for name, third in zip(("query_proj", "key_proj", "value_proj"), np.split(v, 3)):
                out[k2.replace("attn.qkv", f"attn.{name}")] = third
        else:
            out[k2.replace("attn.proj", "attn.out_proj")] = v
    return out


port = ModelPort(ViT, convert=convert, supports={"global_pool": "token"})
