"""mlx-vlm 0.7's Llama 4 vision tower (mlx_vlm/models/llama4/vision.py), unmodified: MLX, NCHW images
unfolded by its own loop (c p1 p2), its class token appended after the patches (``prefix="last"``), its
rotation a complex array of a plain class (no module holds it), up to its final norm (the pixel shuffle
and adapter after it out of scope). As shipped its blocks' MLPs take ``nn.GELU(approx="fast")``, MLX's
x sigmoid(1.702 x), QuickGELU, where transformers' Llama4VisionMLP takes the exact GELU: a finding about
mlx-vlm, located at ``blocks.0.mlp.act``. ``gelu_as_transformers`` sets the exact GELU in each block."""

from dataclasses import replace

from tests.data import hf_llama4_port


def build(config):
    hf_llama4_port.even_grid(config)
    from mlx_vlm.models.llama4.config import VisionConfig
    from mlx_vlm.models.llama4.vision import VisionModel

    width = config.embed_dim
    vision = VisionConfig(
        model_type="llama4_vision_model",
        hidden_size=width,
        image_size=config.img_size[0],
        initializer_range=0.02,
        intermediate_size=config.mlp_hidden_dim,
        norm_eps=config.norm_eps,
        num_attention_heads=config.num_heads,
        num_channels=config.in_chans,
        num_hidden_layers=config.depth,
        patch_size=config.patch_size[0],
        pixel_shuffle_ratio=0.5,
        projector_dropout=0.0,
        projector_input_dim=width,
        projector_output_dim=width,
        rope_theta=config.rope_temperature,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        vision_output_dim=width,
    )
    return VisionModel(vision)


def build_gelu_as_transformers(config):
    import mlx.nn as nn

    model = build(config)
    for layer in model.model.layers:
        layer.mlp.activation_fn = nn.GELU()
    return model


# transformers' Llama 4's names and declarations, which mlx-vlm's sanitize keeps
port = replace(hf_llama4_port.port, build=build)
gelu_as_transformers = replace(hf_llama4_port.port, build=build_gelu_as_transformers)
