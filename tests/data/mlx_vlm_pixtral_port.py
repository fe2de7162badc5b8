"""mlx-vlm 0.7's Pixtral vision tower (mlx_vlm/models/pixtral/vision.py), unmodified: MLX, NHWC
images, every image's tokens in one sequence with an additive block mask (``sequence="one"``), its
rotation from a table over the largest grid indexed by h * width + w, SwiGLU with SiLU (mlx-vlm
takes SiLU whatever the config says, as Pixtral's checkpoints have it); the tower ends at its last
block."""

from conformance.capture import ModelPort
from tests.data import hf_pixtral_port


def build(config):
    from mlx_vlm.models.pixtral.config import VisionConfig
    from mlx_vlm.models.pixtral.vision import VisionModel

    return VisionModel(
        VisionConfig(
            model_type="pixtral",
            num_hidden_layers=config.depth,
            hidden_size=config.embed_dim,
            head_dim=config.head_dim,
            intermediate_size=config.mlp_hidden_dim,
            num_attention_heads=config.num_heads,
            image_size=config.img_size[0],
            patch_size=config.patch_size[0],
            num_channels=config.in_chans,
            rms_norm_eps=config.norm_eps,
            rope_theta=config.rope_temperature,
        )
    )


RENAME = {
    "patch_embed.proj": "vision_model.patch_conv",
    "norm_pre": "vision_model.ln_pre",
    "blocks": "vision_model.transformer.layers",
    "norm1": "attention_norm",
    "norm2": "ffn_norm",
    "attn.q_proj": "attention.q_proj",
    "attn.k_proj": "attention.k_proj",
    "attn.v_proj": "attention.v_proj",
    "attn.proj": "attention.o_proj",
    "mlp.fc1_g": "feed_forward.gate_proj",
    "mlp.fc1_x": "feed_forward.up_proj",
    "mlp.fc2": "feed_forward.down_proj",
}
# transformers' Pixtral's, with the SiLU its MLP takes and MLX's default eps, which its ln_pre keeps
SUPPORTS = {**hf_pixtral_port.SUPPORTS, "act_layer": "silu", "norm_eps": 1e-5}
port = ModelPort(build, rename=RENAME, images="NHWC", tower="blocks.{last}", sequence="one", supports=SUPPORTS)
# its blocks' norms built with eps 1e-6 where the checkpoint's config says 1e-5
eps_1e6 = ModelPort(
    lambda config: build(config.replace(norm_eps=1e-6)),
    rename=RENAME,
    images="NHWC",
    tower="blocks.{last}",
    sequence="one",
    supports=SUPPORTS,
)
