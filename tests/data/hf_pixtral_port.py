"""transformers' PixtralVisionModel, unmodified, as Pixtral reads it: every image's patch tokens in
one sequence with a block-diagonal mask between them (``sequence="one"``), RMSNorm before the blocks
(ln_pre: norm_pre, no patch bias), Pixtral's 2-D rotary bands, SwiGLU, no final norm: the tower ends
at its last block, the adapter after it out of scope."""

from conformance.capture import ModelPort
from tests.data import hf_towers
from weights.hf import towers


build = hf_towers.builder(towers.PIXTRAL)


# timm's names -> transformers' (segments, in order): the table its importer reads too
RENAME = towers.RENAME[towers.PIXTRAL]


SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "pos_embed": "none",
    "rope_type": "pixtral",
    "rope_rotate_half": True,
    "pre_norm": True,
    "norm_layer": "rmsnorm",
    "final_norm": False,
    "class_token": False,
    "global_pool": "avg",
    "qkv_bias": False,
    "qkv_fused": False,
    "proj_bias": False,
    "mlp_layer": "swiglu",
    "norm_eps": 1e-5,  # its RMSNorms' eps is the model's own
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, rename=RENAME, tower="blocks.{last}", sequence="one", supports=SUPPORTS)


def _leaky_build(config):
    """The same tower with its block-diagonal mask gone: every image's tokens attend to the others'
    (a packed batch whose mask leaks)."""
    import transformers.models.pixtral.modeling_pixtral as pixtral

    model = build(config)
    forward = model.forward

    def leaky(*args, **kwargs):
        mask = pixtral.generate_block_attention_mask
        pixtral.generate_block_attention_mask = lambda sizes, tensor: None
        try:
            return forward(*args, **kwargs)
        finally:
            pixtral.generate_block_attention_mask = mask

    model.forward = leaky
    return model


leaky_mask = ModelPort(_leaky_build, rename=RENAME, tower="blocks.{last}", sequence="one", supports=SUPPORTS)
# the port without its word for the packing: its taps are (1, B N, ...)
unsaid_sequence = ModelPort(build, rename=RENAME, tower="blocks.{last}", supports=SUPPORTS)
