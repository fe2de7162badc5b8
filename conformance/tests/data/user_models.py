"""Models a user might write, verified unmodified through ModelPort: a PyTorch ViT whose residual
adds are in place (a tap kept by reference would be overwritten); the README's MLX model with
blocks whose softmax is its own module built on mx.exp (invisible to the softmax interception,
so its weights are read through a tap override) or mlx.nn.softmax; and a Flax NNX model loaded
with the MLX model's rename table. Import it with this directory on sys.path."""

import mlx.core as mx
import mlx.nn as mnn
import torch
from my_port import RENAME  # this directory's README example: the model and its rename table
from my_vit import MyViT
from torch import nn

from conformance.capture import ModelPort


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.num_heads = c.num_heads
        self.qkv = nn.Linear(c.embed_dim, 3 * c.embed_dim, bias=c.qkv_bias)
        self.proj = nn.Linear(c.embed_dim, c.embed_dim)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1, self.act, self.fc2 = (
            nn.Linear(c.embed_dim, c.mlp_hidden_dim),
            nn.GELU(),
            nn.Linear(c.mlp_hidden_dim, c.embed_dim),
        )

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.embed_dim, eps=c.norm_eps), nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.attn, self.mlp = Attention(c), Mlp(c)

    def forward(self, x):
        h = self.attn(self.norm1(x))
        h += x  # in place: the attn tap's tensor becomes the residual sum
        m = self.mlp(self.norm2(h))
        m += h
        return m


class InplaceViT(nn.Module):
    block = Block

    def __init__(self, c):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(c.in_chans, c.embed_dim, c.patch_size, stride=c.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, c.num_tokens, c.embed_dim))
        self.blocks = nn.ModuleList([self.block(c) for _ in range(c.depth)])
        self.norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.head = nn.Linear(c.embed_dim, c.num_classes)

    def forward(self, images):
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        x += self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


inplace_port = ModelPort(InplaceViT, rename={}, supports={"global_pool": "token"})


class ExpSoftmax(mnn.Module):
    def __call__(self, logits):
        e = mx.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


class MLXBlock(mnn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.num_heads
        self.ln_attn, self.ln_ff = (
            mnn.LayerNorm(c.embed_dim, eps=c.norm_eps),
            mnn.LayerNorm(c.embed_dim, eps=c.norm_eps),
        )
        self.to_qkv, self.to_out = (
            mnn.Linear(c.embed_dim, 3 * c.embed_dim, bias=c.qkv_bias),
            mnn.Linear(c.embed_dim, c.embed_dim),
        )
        self.attend = ExpSoftmax()
        self.ff_in, self.ff_out = mnn.Linear(c.embed_dim, c.mlp_hidden_dim), mnn.Linear(c.mlp_hidden_dim, c.embed_dim)

    def __call__(self, x):
        B, N, D = x.shape
        q, k, v = self.to_qkv(self.ln_attn(x)).reshape(B, N, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        a = self.attend((q * q.shape[-1] ** -0.5) @ k.transpose(0, 1, 3, 2))
        x = x + self.to_out((a @ v).transpose(0, 2, 1, 3).reshape(B, N, D))
        return x + self.ff_out(mnn.gelu(self.ff_in(self.ln_ff(x))))


class MLXViT(MyViT):
    """The README's model (my_vit.py) with these blocks."""

    def __init__(self, c):
        super().__init__(c)
        self.layers = [MLXBlock(c) for _ in range(c.depth)]


own_softmax_port = ModelPort(MLXViT, rename=RENAME, supports={"global_pool": "token"})


def _nnx_vit():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class NNXBlock(nnx.Module):
        def __init__(self, c, rngs):
            D = c.embed_dim
            self.heads = c.num_heads
            self.ln_attn = nnx.LayerNorm(D, epsilon=c.norm_eps, use_fast_variance=False, rngs=rngs)
            self.ln_ff = nnx.LayerNorm(D, epsilon=c.norm_eps, use_fast_variance=False, rngs=rngs)
            self.to_qkv = nnx.Linear(D, 3 * D, use_bias=c.qkv_bias, rngs=rngs)
            self.to_out = nnx.Linear(D, D, rngs=rngs)  # square: its kernel fits transposed or not
            self.ff_in, self.ff_out = (
                nnx.Linear(D, c.mlp_hidden_dim, rngs=rngs),
                nnx.Linear(c.mlp_hidden_dim, D, rngs=rngs),
            )

        def __call__(self, x):
            B, N, D = x.shape
            q, k, v = self.to_qkv(self.ln_attn(x)).reshape(B, N, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
            a = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5, axis=-1)
            x = x + self.to_out(jnp.einsum("bhqk,bhkd->bhqd", a, v).transpose(0, 2, 1, 3).reshape(B, N, D))
            return x + self.ff_out(nnx.gelu(self.ff_in(self.ln_ff(x)), approximate=False))

    class NNXViT(nnx.Module):
        def __init__(self, c):
            rngs = nnx.Rngs(0)
            self.stem = nnx.Conv(
                c.in_chans, c.embed_dim, c.patch_size, strides=c.patch_size, padding="VALID", rngs=rngs
            )
            self.cls = nnx.Param(jnp.zeros((1, 1, c.embed_dim)))
            self.pos = nnx.Param(jnp.zeros((1, c.num_tokens, c.embed_dim)))
            self.layers = nnx.List([NNXBlock(c, rngs) for _ in range(c.depth)])
            self.ln_out = nnx.LayerNorm(c.embed_dim, epsilon=c.norm_eps, use_fast_variance=False, rngs=rngs)
            self.classifier = nnx.Linear(c.embed_dim, c.num_classes, rngs=rngs)

        def __call__(self, images):  # NHWC
            x = self.stem(images)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[2])), x], 1) + self.pos[...]
            for layer in self.layers:
                x = layer(x)
            return self.classifier(self.ln_out(x)[:, 0])

    return NNXViT


# The MLX model's rename table serves the Flax one: layouts and Flax's kernel/scale names follow
# the receiving modules.
def _build_nnx(config):
    from flax import nnx

    return nnx.eval_shape(lambda: _nnx_vit()(config))  # shapes only: every parameter comes from the mapping


nnx_port = ModelPort(_build_nnx, rename=RENAME, images="NHWC", supports={"global_pool": "token"})


class NNSoftmax(mnn.Module):
    def __call__(self, logits):
        return mnn.softmax(logits, axis=-1)  # mlx.nn's, which MLX compiles (shapeless)


class NNSoftmaxBlock(MLXBlock):
    """The same block with mlx.nn.softmax."""

    def __init__(self, c):
        super().__init__(c)
        self.attend = NNSoftmax()


class NNSoftmaxViT(MLXViT):
    def __init__(self, c):
        super().__init__(c)
        self.layers = [NNSoftmaxBlock(c) for _ in range(c.depth)]


nn_softmax_port = ModelPort(NNSoftmaxViT, rename=RENAME, supports={"global_pool": "token"})


class SeqFirstBlock(nn.Module):
    """A block on nn.MultiheadAttention as older PyTorch code writes it: sequence first
    (batch_first=False), called with its default need_weights=True (the head-averaged weights
    returned and thrown away), which keeps torch off the native fast path."""

    def __init__(self, c):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.embed_dim, eps=c.norm_eps), nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.attn = nn.MultiheadAttention(c.embed_dim, c.num_heads)
        self.mlp = Mlp(c)

    def forward(self, x):  # (N, B, D)
        h = self.norm1(x)
        x = x + self.attn(h, h, h)[0]
        return x + self.mlp(self.norm2(x))


class SeqFirstViT(InplaceViT):
    block = SeqFirstBlock

    def forward(self, images):
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        x = x.transpose(0, 1)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x.transpose(0, 1))[:, 0])


seq_first_port = ModelPort(
    SeqFirstViT,
    rename={
        "attn.qkv.weight": "attn.in_proj_weight",
        "attn.qkv.bias": "attn.in_proj_bias",
        "attn.proj": "attn.out_proj",
    },
    supports={"global_pool": "token", "qkv_bias": True},
)
