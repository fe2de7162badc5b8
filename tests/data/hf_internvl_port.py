"""transformers' InternVLVisionModel (InternViT-300M's layout), unmodified, as InternVL reads it: the
last block's tokens (``last_hidden_state``; the tower has no final norm), the merger after it out of
scope. The config says its parts (final_norm=False, LayerScale, q, k and v apart without biases, the
class token); LayerScale is held as bare parameters of each layer (``lambda_1``, ``lambda_2``)."""

from conformance.capture import ModelPort
from tests.data import hf_towers
from weights.hf import towers


build = hf_towers.builder(towers.INTERNVL)


# timm's names -> transformers' (segments, in order): the table its importer reads too
RENAME = towers.RENAME[towers.INTERNVL]


SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "final_norm": False,
    "init_values": lambda v: v is not None,
    "qkv_bias": False,
    "qkv_fused": False,
    "class_token": True,
    "global_pool": "token",
    "square_images": True,  # its position table is resized as a square
    "square_patches": True,
}
port = ModelPort(build, rename=RENAME, tower="blocks.{last}", supports=SUPPORTS)


# a rename that sends ls1's gamma to lambda_2 and ls2's to lambda_1 (a copy-paste slip)
lambdas_swapped = ModelPort(
    build,
    rename={**RENAME, "ls1.gamma": "lambda_2", "ls2.gamma": "lambda_1"},
    tower="blocks.{last}",
    supports=SUPPORTS,
)
