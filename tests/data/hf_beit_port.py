"""transformers' BeitForImageClassification, unmodified, as BEiT without its relative position
bias (absolute position embeddings, class-token pooling): LayerScale held as bare parameters of
each layer (lambda_1, lambda_2, multiplied inside BeitLayer.forward) and a k projection without
bias. A convert as conversion scripts write it: the ViT names under ``beit.``, the gammas to
lambda_1 and lambda_2, qkv split and its k bias dropped."""

from conformance.capture import ModelPort
from conformance.examples.hf_vit import convert as vit_convert
from weights.hf.common import sizes_to_hf


def _settings(config, **beit) -> dict:
    """BeitConfig: config.json's names for the config's sizes, and ``beit``'s own settings."""
    return sizes_to_hf(config) | dict(num_labels=config.num_classes, layer_scale_init_value=config.init_values, **beit)


def build(config):
    from transformers import BeitConfig, BeitForImageClassification

    settings = _settings(
        config,
        use_relative_position_bias=False,
        use_shared_relative_position_bias=False,
        use_absolute_position_embeddings=True,
        use_mean_pooling=False,
    )
    return BeitForImageClassification(BeitConfig(**settings)).eval()


def convert(state):
    out = {}
    for key, value in vit_convert(state, prefix="beit.").items():
        if key.endswith("k_proj.bias"):
            continue  # BEiT's key projection has no bias
        out[key.replace(".ls1.gamma", ".lambda_1").replace(".ls2.gamma", ".lambda_2")] = value
    return out


SUPPORTS = {"global_pool": "token", "init_values": 0.1, "square_images": True, "square_patches": True}
port = ModelPort(build, convert=convert, output=lambda out: out.logits, supports=SUPPORTS)


def build_relative(config):
    """BeitForImageClassification as BEiT is: a relative position bias in every layer (its own
    module, relative_position_bias), no absolute position embeddings, the patch tokens' mean
    normalised by the pooler's layernorm."""
    from transformers import BeitConfig, BeitForImageClassification

    settings = _settings(
        config, use_relative_position_bias=True, use_absolute_position_embeddings=False, use_mean_pooling=True
    )
    return BeitForImageClassification(BeitConfig(**settings)).eval()


def convert_relative(state):
    """The canonical BEiT state in transformers' names: q's and v's biases to their projections,
    each block's table to its layer's relative_position_bias, fc_norm to the pooler's layernorm."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if key.startswith("fc_norm."):
            out[f"beit.pooler.layernorm.{parts[-1]}"] = value
        elif key.endswith("relative_position_bias_table"):
            out[f"beit.layers.{parts[1]}.relative_position_bias.relative_position_bias_table"] = value
        elif key.endswith(("attn.q_bias", "attn.v_bias")):
            out[f"beit.layers.{parts[1]}.attention.{parts[-1][0]}_proj.bias"] = value
        else:
            out.update(convert({key: value}))
    return out


RELATIVE = {
    "global_pool": "avg",
    "init_values": 0.1,
    "k_bias": False,
    "pos_embed": "none",
    "rel_pos_bias": True,
    "square_images": True,
    "square_patches": True,
}
relative_port = ModelPort(build_relative, convert=convert_relative, output=lambda out: out.logits, supports=RELATIVE)
