"""mlx-vlm 0.7's Pixtral vision tower (mlx_vlm/models/pixtral/vision.py), unmodified: MLX, NHWC
images, every image's tokens in one sequence with an additive block mask (``sequence="one"``), its
rotation from a table over the largest grid indexed by h * width + w, SwiGLU with SiLU (mlx-vlm
takes SiLU whatever the config says, as Pixtral's checkpoints have it); the tower ends at its last
block."""

from conformance.capture import ModelPort
from tests.data import hf_pixtral_port
from weights.hf.common import sizes_to_hf


def build(config):
    from mlx_vlm.models.pixtral.config import VisionConfig
    from mlx_vlm.models.pixtral.vision import VisionModel

    # as its loader reads a checkpoint's vision_config (from_dict takes the fields it knows)
    own = dict(model_type="pixtral", head_dim=config.head_dim, rms_norm_eps=config.norm_eps)
    return VisionModel(VisionConfig.from_dict(sizes_to_hf(config) | own | dict(rope_theta=config.rope_temperature)))


# transformers' Pixtral's names, its outer modules under vision_model
OUTER = ("patch_embed.proj", "norm_pre", "blocks")
RENAME = {k: f"vision_model.{v}" if k in OUTER else v for k, v in hf_pixtral_port.RENAME.items()}
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
