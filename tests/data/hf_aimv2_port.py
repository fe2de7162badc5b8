"""transformers' Aimv2VisionModel, unmodified, as a VLM reads it: the tower's tokens after its final
RMSNorm (``last_hidden_state``), its attention-pooling head left out (``use_head=False``). The
config says AIMv2's parts (norm_layer='rmsnorm', embed_norm, SwiGLU, q, k and v apart, no biases
but the patch projection's, no class token); the port says where the tower ends (``tower='norm'``)."""

from conformance.capture import ModelPort
from tests.data import hf_towers
from weights.hf import towers


build = hf_towers.builder(towers.AIMV2)


# timm's names -> transformers' (segments, in order): the table its importer reads too
RENAME = towers.RENAME[towers.AIMV2]


# AIMv2 as its tower: the config's head and pooling are after the tower, out of scope
SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "norm_layer": "rmsnorm",
    "embed_norm": True,
    "class_token": False,
    "global_pool": "avg",
    "fc_norm": False,
    "qkv_bias": False,
    "qkv_fused": False,
    "proj_bias": False,
    "mlp_layer": "swiglu",
    "act_layer": "silu",
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, rename=RENAME, tower="norm", supports=SUPPORTS)
# the bug mlx-vlm shipped in a tower's norm: eps 1e-6 where the checkpoint's config says 1e-5
eps_1e6 = ModelPort(lambda config: build(config.replace(norm_eps=1e-6)), rename=RENAME, tower="norm", supports=SUPPORTS)
# a tower ending at a stage the config has not: the port's own word, exit 2
merger = ModelPort(build, rename=RENAME, tower="merger", supports=SUPPORTS)
