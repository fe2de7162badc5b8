"""A Flax linen ViT with the module names of the original ViT checkpoints
(google-research/vision_transformer: ``Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1``,
``MlpBlock_3``, ``encoder_norm``, ``head``), unbound, as linen models are written. Its mapping
is this project's own exporter to that layout (``weights.layouts.big_vision.to_npz``), '/' read as '.'."""

from conformance.capture import ModelPort
from weights.layouts.big_vision import to_npz

try:
    import flax.linen as nn
    import jax.numpy as jnp
except ImportError:  # importable for listing; build() needs Flax
    nn = None


def _modules(fast_variance):
    def layer_norm(name, eps):
        # linen's default use_fast_variance=True computes E[x²] - E[x]²; timm E[(x - E[x])²].
        return nn.LayerNorm(epsilon=eps, use_fast_variance=fast_variance, name=name)

    class MlpBlock(nn.Module):
        mlp_dim: int

        @nn.compact
        def __call__(self, inputs):
            x = nn.Dense(self.mlp_dim, name="Dense_0")(inputs)
            x = nn.gelu(x, approximate=False)
            return nn.Dense(inputs.shape[-1], name="Dense_1")(x)

    class Encoder1DBlock(nn.Module):
        mlp_dim: int
        num_heads: int
        eps: float

        @nn.compact
        def __call__(self, inputs):
            x = layer_norm("LayerNorm_0", self.eps)(inputs)
            x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name="MultiHeadDotProductAttention_1")(x, x)
            x = x + inputs
            y = layer_norm("LayerNorm_2", self.eps)(x)
            return x + MlpBlock(self.mlp_dim, name="MlpBlock_3")(y)

    class Encoder(nn.Module):
        depth: int
        mlp_dim: int
        num_heads: int
        eps: float

        @nn.compact
        def __call__(self, x):
            pos = self.param("posembed_input", nn.initializers.normal(0.02), (1,) + x.shape[1:])
            x = x + pos
            for i in range(self.depth):
                x = Encoder1DBlock(self.mlp_dim, self.num_heads, self.eps, name=f"encoderblock_{i}")(x)
            return layer_norm("encoder_norm", self.eps)(x)

    class VisionTransformer(nn.Module):
        config: object

        @nn.compact
        def __call__(self, images):  # NHWC
            c = self.config
            x = nn.Conv(c.embed_dim, c.patch_size, strides=c.patch_size, padding="VALID", name="embedding")(images)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c.embed_dim))
            x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)
            x = Encoder(c.depth, c.mlp_hidden_dim, c.num_heads, c.norm_eps, name="Transformer")(x)
            return nn.Dense(c.num_classes, name="head")(x[:, 0])

    return VisionTransformer


def build(config, fast_variance=False):
    return _modules(fast_variance)(config)


def convert(state, config):

    out = {k.replace("/", "."): v for k, v in to_npz(state, config).items()}
    # The original layout nests the position embedding in a module of its own; here it is a
    # parameter of the encoder.
    out["Transformer.posembed_input"] = out.pop("Transformer.posembed_input.pos_embedding")
    return out


SUPPORTS = {"global_pool": "token", "class_token": True}
port = ModelPort(build, convert=convert, images="NHWC", supports=SUPPORTS)
# linen's LayerNorm default, use_fast_variance=True: located at blocks.0.norm1 on trained-like weights.
fast_variance_port = ModelPort(
    lambda config: build(config, fast_variance=True), convert=convert, images="NHWC", supports=SUPPORTS
)
