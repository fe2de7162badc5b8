"""keras-hub's ``ViTBackbone`` (Keras 3), unmodified, on the backend ``KERAS_BACKEND`` names (JAX
unless it says PyTorch; Keras takes it once, at import: Keras's own default, TensorFlow, is not
installed). It takes NHWC images, keeps q, k and
v as separate EinsumDense projections ((D, heads, head_dim) kernels) and returns the final
norm's tokens, so the port reads the class token's row as the pooled output of a headless
model (``num_classes=0``). The convert is keras-hub's own timm conversion, in Keras's layouts."""

import os

import numpy as np

from conformance.capture import ModelPort, rename_function
from conformance.examples.torchvision_vit import encoder_sizes

os.environ.setdefault("KERAS_BACKEND", "jax")

RENAME = {
    "patch_embed.proj.weight": "vit_patching_and_embedding.patch_embedding.kernel",
    "patch_embed.proj.bias": "vit_patching_and_embedding.patch_embedding.bias",
    "cls_token": "vit_patching_and_embedding.class_token",
    "pos_embed": "vit_patching_and_embedding.position_embedding.embeddings",
    "norm.weight": "vit_encoder.ln.gamma",
    "norm.bias": "vit_encoder.ln.beta",
}
BLOCK = {
    "norm1.weight": "ln_1.gamma",
    "norm1.bias": "ln_1.beta",
    "norm2.weight": "ln_2.gamma",
    "norm2.bias": "ln_2.beta",
    "attn.proj.weight": "mha.attention_output.kernel",
    "attn.proj.bias": "mha.attention_output.bias",
    "mlp.fc1.weight": "mlp.dense_1.kernel",
    "mlp.fc1.bias": "mlp.dense_1.bias",
    "mlp.fc2.weight": "mlp.dense_2.kernel",
    "mlp.fc2.bias": "mlp.dense_2.bias",
}


def convert(state, config):
    """Canonical (timm) state -> keras-hub's weights in their layouts: kernels input axes first."""
    H, hd, D = config.num_heads, config.head_dim, config.embed_dim
    rename = rename_function(RENAME)
    out = {}
    for key, value in state.items():
        if not key.startswith("blocks."):
            out[rename(key)] = value.transpose(2, 3, 1, 0) if key == "patch_embed.proj.weight" else value
            continue
        _, i, rest = key.split(".", 2)
        block = f"vit_encoder.transformer_block_{int(i) + 1}"
        if rest.startswith("attn.qkv."):
            for part, third in zip(("query", "key", "value"), np.split(value, 3)):
                out[f"{block}.mha.{part}.{rest.rpartition('.')[2].replace('weight', 'kernel')}"] = (
                    third.T.reshape(D, H, hd) if third.ndim == 2 else third.reshape(H, hd)
                )
        elif rest == "attn.proj.weight":
            out[f"{block}.{BLOCK[rest]}"] = value.T.reshape(H, hd, D)
        else:
            out[f"{block}.{BLOCK[rest]}"] = (
                value.T if rest.endswith("fc1.weight") or rest.endswith("fc2.weight") else value
            )
    return out


def build(config):
    import keras_hub

    return keras_hub.models.ViTBackbone(
        image_shape=(*config.img_size, config.in_chans),
        patch_size=config.patch_size,
        layer_norm_epsilon=config.norm_eps,
        use_class_token=True,
        **encoder_sizes(config),  # keras-hub's ViT takes torchvision's names for them
    )


def class_token(tokens):
    return tokens[:, 0]


# The class token, pooled by the final norm's row 0; no head (keras-hub's classifier adds one apart)
SUPPORTS = {"global_pool": "token", "num_classes": 0, "in_chans": 3, "qkv_bias": True}
port = ModelPort(build, convert=convert, images="NHWC", output=class_token, supports=SUPPORTS)
# The same with every LayerNorm at Keras's default eps, 1e-3 (keras-hub's ViT takes 1e-6 from timm)
eps_1e3_port = ModelPort(
    lambda config: build(config.replace(norm_eps=1e-3)),
    convert=convert,
    images="NHWC",
    output=class_token,
    supports=SUPPORTS,
)
