"""A Flax NNX ViT written in another style than impls/jax_vit.py: Flax's own
``nnx.MultiHeadAttention`` (LinearGeneral kernels (D, H, hd) and (H, hd, D)), NHWC images, an
``nnx.Sequential`` MLP and a class token concatenated by ``jnp.tile``. The convert lays the
canonical weights out as Flax does."""

import numpy as np

from conformance.capture import ModelPort

try:
    import jax.numpy as jnp
    from flax import nnx
except ImportError:  # the module stays importable for listing; build() needs Flax
    nnx = None


def _modules(fast_variance=False, dtype=None):
    # dtype: Flax's mixed precision, the compute dtype of the projections and the MLP (their
    # parameters stay float32, param_dtype's default); LayerNorm computes and returns float32.
    compute = {} if dtype is None else {"dtype": dtype}

    class EncoderBlock(nnx.Module):
        def __init__(self, c, rngs):
            # Flax's default use_fast_variance=True computes E[x²] - E[x]², which cancels on
            # trained ViT activations (the zoo's jax_fast_variance); timm computes E[(x - E[x])²].
            self.ln_1 = nnx.LayerNorm(c.embed_dim, epsilon=c.norm_eps, use_fast_variance=fast_variance, rngs=rngs)
            self.attention = nnx.MultiHeadAttention(
                num_heads=c.num_heads, in_features=c.embed_dim, use_bias=c.qkv_bias, decode=False, rngs=rngs, **compute
            )
            self.ln_2 = nnx.LayerNorm(c.embed_dim, epsilon=c.norm_eps, use_fast_variance=fast_variance, rngs=rngs)
            self.mlp = nnx.Sequential(
                nnx.Linear(c.embed_dim, c.mlp_hidden_dim, rngs=rngs, **compute),
                lambda x: nnx.gelu(x, approximate=False),
                nnx.Linear(c.mlp_hidden_dim, c.embed_dim, rngs=rngs, **compute),
            )

        def __call__(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class ViT(nnx.Module):
        def __init__(self, c, rngs):
            self.stem = nnx.Conv(
                c.in_chans,
                c.embed_dim,
                kernel_size=c.patch_size,
                strides=c.patch_size,
                padding="VALID",
                rngs=rngs,
                **compute,
            )
            self.cls = nnx.Param(jnp.zeros((1, 1, c.embed_dim)))
            self.pos = nnx.Param(jnp.zeros((1, c.num_tokens, c.embed_dim)))
            self.encoder = nnx.List([EncoderBlock(c, rngs) for _ in range(c.depth)])
            self.ln = nnx.LayerNorm(c.embed_dim, epsilon=c.norm_eps, use_fast_variance=fast_variance, rngs=rngs)
            self.classifier = nnx.Linear(c.embed_dim, c.num_classes, rngs=rngs, **compute)

        def __call__(self, images):  # NHWC
            x = self.stem(images)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            x = jnp.concatenate([jnp.tile(self.cls[...], (x.shape[0], 1, 1)), x], axis=1) + self.pos[...]
            for block in self.encoder:
                x = block(x)
            return self.classifier(self.ln(x)[:, 0])

    return ViT


def build(config, fast_variance=False):
    # Abstract, as Flax's checkpoint-restore recipe builds a model: shapes only, no initializer
    # run (eagerly each would compile); every parameter comes from the checkpoint.
    return nnx.eval_shape(lambda: _modules(fast_variance)(config, nnx.Rngs(0)))


def build_mixed(config, dtype="float32"):
    """Flax mixed precision: built for the dtype asked for (``dtype=`` on the projections, the
    MLP and the stem; float32 parameters and LayerNorms), so one port serves every dtype."""
    compute = None if dtype == "float32" else getattr(jnp, dtype)
    return nnx.eval_shape(lambda: _modules(dtype=compute)(config, nnx.Rngs(0)))


def _name(key):
    """A canonical key's Flax name, and whether its array is a kernel (transposed)."""
    module, _, leaf = key.rpartition(".")
    module = {"norm": "ln", "head": "classifier", "patch_embed.proj": "stem"}.get(module, module)
    module = module.replace("blocks.", "encoder.")
    for timm, mine in (("norm1", "ln_1"), ("norm2", "ln_2"), ("mlp.fc1", "mlp.layers.0"), ("mlp.fc2", "mlp.layers.2")):
        module = module.replace(timm, mine)
    if leaf == "weight":
        leaf = "scale" if module.rsplit(".", 1)[-1].startswith("ln") else "kernel"
    return f"{module}.{leaf}", leaf == "kernel"


def convert(state, config):
    D, H, hd = config.embed_dim, config.num_heads, config.head_dim
    out = {}
    for key, value in state.items():
        if key in ("cls_token", "pos_embed"):
            out[{"cls_token": "cls", "pos_embed": "pos"}[key]] = value
        elif key == "patch_embed.proj.weight":
            out["stem.kernel"] = value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif ".attn.qkv." in key:
            block = key.split(".attn.")[0].replace("blocks.", "encoder.")
            for name, third in zip(("query", "key", "value"), np.split(value, 3)):
                out[
                    f"{block}.attention.{name}.kernel" if key.endswith("weight") else f"{block}.attention.{name}.bias"
                ] = third.T.reshape(D, H, hd) if key.endswith("weight") else third.reshape(H, hd)
        elif ".attn.proj." in key:
            block = key.split(".attn.")[0].replace("blocks.", "encoder.")
            out[f"{block}.attention.out.kernel" if key.endswith("weight") else f"{block}.attention.out.bias"] = (
                value.T.reshape(H, hd, D) if key.endswith("weight") else value
            )
        else:
            name, kernel = _name(key)
            out[name] = value.T if kernel else value
    return out


SUPPORTS = {"global_pool": "token", "qkv_bias": True}
port = ModelPort(build, convert=convert, images="NHWC", supports=SUPPORTS)
# The same model with Flax's LayerNorm default (use_fast_variance=True): located at blocks.0.norm1.
fast_variance_port = ModelPort(
    lambda config: build(config, fast_variance=True), convert=convert, images="NHWC", supports=SUPPORTS
)
# Flax mixed precision (verify --dtype bfloat16): float32 parameters, bfloat16 compute in the
# projections and the MLP, float32 LayerNorms and residual stream, each stage judged as stored.
mixed_port = ModelPort(build_mixed, convert=convert, images="NHWC", supports=SUPPORTS)
