"""A ViT in Equinox on eqx.nn.MultiheadAttention (this project's, written as Equinox's docs write
models: modules on one image, vmapped over tokens inside; Equimo's, the third-party Equinox ViT,
has an attention of its own): the adapter reads eqx.nn.MultiheadAttention's q (before its scale),
k, v and weights under its vmap over heads."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from conformance.capture import ModelPort


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, dim, heads, hidden, eps, key):
        k1, k2, k3 = jr.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(dim, eps=eps)
        biases = dict.fromkeys(("use_query_bias", "use_key_bias", "use_value_bias", "use_output_bias"), True)
        self.attn = eqx.nn.MultiheadAttention(heads, dim, **biases, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim, eps=eps)
        self.fc1 = eqx.nn.Linear(dim, hidden, key=k2)
        self.fc2 = eqx.nn.Linear(hidden, dim, key=k3)

    def __call__(self, x):
        y = jax.vmap(self.norm1)(x)
        x = x + self.attn(y, y, y)
        y = jax.vmap(self.norm2)(x)
        return x + jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(y), approximate=False))


class ViT(eqx.Module):
    patch_embed: eqx.nn.Conv2d
    cls_token: jax.Array
    pos_embed: jax.Array
    blocks: list
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, c, key):
        keys = jr.split(key, c.depth + 2)
        D = c.embed_dim
        self.patch_embed = eqx.nn.Conv2d(c.in_chans, D, c.patch_size, stride=c.patch_size, key=keys[0])
        self.cls_token = jnp.zeros((1, D))
        self.pos_embed = jnp.zeros((c.num_patches + 1, D))
        self.blocks = [Block(D, c.num_heads, c.mlp_hidden_dim, c.norm_eps, k) for k in keys[2:]]
        self.norm = eqx.nn.LayerNorm(D, eps=c.norm_eps)
        self.head = eqx.nn.Linear(D, c.num_classes, key=keys[1])

    def __call__(self, image):
        x = self.patch_embed(image)
        x = x.reshape(x.shape[0], -1).T
        x = jnp.concatenate([self.cls_token, x]) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(jax.vmap(self.norm)(x)[0])


def convert(state, config):
    """Canonical state -> this model's leaves (Equinox keeps PyTorch's layouts)."""
    out = {}
    for k, v in state.items():
        if ".attn.qkv." in k:
            for part, third in zip(("query_proj", "key_proj", "value_proj"), np.split(v, 3)):
                out[k.replace("attn.qkv", f"attn.{part}")] = third
        elif ".attn.proj." in k:
            out[k.replace("attn.proj", "attn.output_proj")] = v
        elif ".mlp.fc" in k:
            out[k.replace("mlp.", "")] = v
        elif k.startswith("patch_embed.proj."):
            out[k.replace("proj.", "")] = v.reshape(-1, 1, 1) if k.endswith("bias") else v
        elif k in ("cls_token", "pos_embed"):
            out[k] = v.reshape(-1, config.embed_dim)
        else:
            out[k] = v
    return out


SUPPORTS = {
    "global_pool": "token",
    "qkv_bias": True,
    "square_images": True,
    "square_patches": True,
    "act_layer": "gelu",
}
port = ModelPort(lambda config: ViT(config, jr.PRNGKey(0)), convert=convert, supports=SUPPORTS)
# the companion: every LayerNorm at eqx.nn.LayerNorm's default eps, 1e-5
eps_1e5_port = ModelPort(
    lambda config: ViT(config.replace(norm_eps=1e-5), jr.PRNGKey(0)), convert=convert, supports=SUPPORTS
)
