"""An MLX ViT written with its own parameter names, and the factory that checks it."""

import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class Layer(nn.Module):
    def __init__(self, dim, heads, hidden, eps):
        super().__init__()
        self.heads = heads
        self.ln_attn, self.ln_ff = nn.LayerNorm(dim, eps=eps), nn.LayerNorm(dim, eps=eps)
        self.to_qkv, self.to_out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff_in, self.ff_out = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def __call__(self, x):
        B, N, D = x.shape
        q, k, v = self.to_qkv(self.ln_attn(x)).reshape(B, N, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5)
        x = x + self.to_out(a.transpose(0, 2, 1, 3).reshape(B, N, D))
        return x + self.ff_out(nn.gelu(self.ff_in(self.ln_ff(x))))


class MyViT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.stem = nn.Conv2d(c.in_chans, c.embed_dim, c.patch_size, stride=c.patch_size)
        self.cls, self.pos = mx.zeros((1, 1, c.embed_dim)), mx.zeros((1, c.num_tokens, c.embed_dim))
        self.layers = [Layer(c.embed_dim, c.num_heads, c.mlp_hidden_dim, c.norm_eps) for _ in range(c.depth)]
        self.ln_out, self.classifier = nn.LayerNorm(c.embed_dim, eps=c.norm_eps), nn.Linear(c.embed_dim, c.num_classes)

    def __call__(self, images):  # NCHW in, logits out; class-token pooling only
        x = self.stem(images.transpose(0, 2, 3, 1))
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = mx.concatenate([mx.broadcast_to(self.cls, (x.shape[0], 1, x.shape[2])), x], axis=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.ln_out(x)[:, 0])


# timm's names -> yours (a segment or a dotted path; {i} for a block index); layouts follow your modules
RENAME = {
    "cls_token": "cls",
    "pos_embed": "pos",
    "patch_embed.proj": "stem",
    "blocks": "layers",
    "norm1": "ln_attn",
    "norm2": "ln_ff",
    "attn.qkv": "to_qkv",
    "attn.proj": "to_out",
    "mlp.fc1": "ff_in",
    "mlp.fc2": "ff_out",
    "norm": "ln_out",
    "head": "classifier",
}


def to_my_names(key):  # "blocks.0.attn.qkv.weight" -> "layers.0.to_qkv.weight"
    for timm_name, mine in RENAME.items():
        key = re.sub(rf"(^|\.){re.escape(timm_name)}(?=\.|$)", rf"\g<1>{mine}", key)
    return key


def make(config, state):
    """The port factory: canonical (timm) float32 state in, forward(images) -> logits out."""
    model = MyViT(config)
    weights = []
    for key, value in state.items():
        if key == "patch_embed.proj.weight":
            value = value.transpose(0, 2, 3, 1)  # OIHW -> MLX's OHWI
        weights.append((to_my_names(key), mx.array(value)))
    model.load_weights(weights, strict=True)
    model.eval()
    return lambda images: np.array(model(mx.array(images)))
