"""transformers' Qwen3-VL vision tower (Qwen3VLVisionModel), unmodified, as Qwen3-VL reads it, up to
its last block: its input made by the same wrapper as Qwen2.5-VL's (tests/data/hf_qwen2_5_vl_port.py),
its tokens in 2 x 2 merge groups in one sequence; a learned position table (here at the image's own
grid, so its bilinear resampling is the identity) and Qwen2-VL's rotation, LayerNorm, a GELU MLP, no
final norm. Its merger and the deepstack mergers it calls between blocks (on block 0's tokens here)
are after the tower: their parameters out of scope."""

import numpy as np

from conformance.capture import ModelPort, rename_function
from tests.data import hf_qwen2_5_vl_port as qwen2_5


def build(config):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    qwen2_5.mergeable(config)
    visual = Qwen3VLVisionModel._from_config(
        Qwen3VLVisionConfig(
            **qwen2_5.settings(config), num_position_embeddings=config.num_patches, deepstack_visual_indexes=[0]
        )
    )
    return qwen2_5.processed(visual, config)


# timm's names -> Qwen3-VL's (segments)
RENAME = {
    "blocks": "visual.blocks",
    "patch_embed.proj": "visual.patch_embed.proj",
    "mlp.fc1": "mlp.linear_fc1",
    "mlp.fc2": "mlp.linear_fc2",
}


def convert(state):
    """The canonical state under Qwen3-VL's names; the patch kernel as the first of its two identical
    frames (the second's zero), the position table as its embedding's (N, D) rows."""
    rename = rename_function(RENAME)
    out = {rename(k): v for k, v in state.items() if k not in ("patch_embed.proj.weight", "pos_embed")}
    w = np.asarray(state["patch_embed.proj.weight"])
    out["visual.patch_embed.proj.weight"] = np.stack([w, np.zeros_like(w)], axis=2)
    out["visual.pos_embed.weight"] = np.asarray(state["pos_embed"])[0]
    return out


SUPPORTS = {
    "num_classes": 0,  # a tower: its features are its output
    "rope_type": "cat",
    "rope_rotate_half": True,
    "final_norm": False,
    "class_token": False,
    "global_pool": "avg",
    "act_layer": "gelu_tanh",
    "norm_eps": 1e-6,
    "square_images": True,
    "square_patches": True,
}
port = ModelPort(build, convert=convert, tower="blocks.{last}", sequence="merge2x2", supports=SUPPORTS)
