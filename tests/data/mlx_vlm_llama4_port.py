"""mlx-vlm 0.7's Llama 4 vision tower (mlx_vlm/models/llama4/vision.py), unmodified: MLX, NCHW images
unfolded by its own loop (c p1 p2), its class token appended after the patches (``prefix="last"``), its
rotation a complex array of a plain class (no module holds it), up to its final norm (the pixel shuffle
and adapter after it out of scope). As shipped its blocks' MLPs take ``nn.GELU(approx="fast")``, MLX's
x sigmoid(1.702 x), QuickGELU, where transformers' Llama4VisionMLP takes the exact GELU: a finding about
mlx-vlm, located at ``blocks.0.mlp.act``. ``gelu_as_transformers`` sets the exact GELU in each block."""

from dataclasses import replace

from tests.data import hf_llama4_port


def build(config):
    from mlx_vlm.models.llama4.config import VisionConfig
    from mlx_vlm.models.llama4.vision import VisionModel

    # as its loader reads a checkpoint's vision_config (from_dict takes the fields it knows), with the
    # fields mlx-vlm's VisionConfig requires that transformers' does not name so
    own = dict(
        model_type="llama4_vision_model",
        initializer_range=0.02,
        rope_theta=config.rope_temperature,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_dropout=0.0,
    )
    return VisionModel(VisionConfig.from_dict(hf_llama4_port.settings(config) | own))


def build_gelu_as_transformers(config):
    import mlx.nn as nn

    model = build(config)
    for layer in model.model.layers:
        layer.mlp.activation_fn = nn.GELU()
    return model


# transformers' Llama 4's names and declarations, which mlx-vlm's sanitize keeps
port = replace(hf_llama4_port.port, build=build)
gelu_as_transformers = replace(hf_llama4_port.port, build=build_gelu_as_transformers)
