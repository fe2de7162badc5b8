"""transformers' SAM image encoder's layout (weights/hf/sam.py): its save_pretrained directory, neck
left out, read (config inferred) and the oracle giving its last block; canonical -> transformers ->
canonical bitwise; its neck and what the layout cannot hold refused by name."""

import json

import numpy as np
import pytest

from conformance.generators import make_images
from impls import get_config, numpy_vit
from weights import hf, init_state
from weights.canonical import WeightError
from weights.hf import sam
from tests.hf_layouts import drawn, refused_with_its_part_after_the_tower, written_read_and_loaded

# a 10 x 10 grid of 4-pixel patches in 4 x 4 windows (padded to 12 x 12), the last block global
SETTINGS = dict(
    hidden_size=24, num_hidden_layers=2, num_attention_heads=3, image_size=40, patch_size=4, window_size=4,
    global_attn_indexes=[1], mlp_dim=48, output_channels=8, use_rel_pos=True, use_abs_pos=True,
)  # fmt: skip


def _encoder(seed: int = 0):
    """transformers' encoder for SETTINGS, every parameter drawn."""
    from transformers import SamVisionConfig, SamVisionModel

    return drawn(SamVisionModel(SamVisionConfig(**SETTINGS)), seed)


def _last_block(model, images: np.ndarray) -> np.ndarray:
    """The encoder's last block's tokens, (B, h, w, D) as (B, h w, D)."""
    import torch

    seen = []
    layer = model.vision_encoder.layers[-1]
    handle = layer.register_forward_hook(
        lambda mod, args, out: seen.append((out[0] if isinstance(out, tuple) else out))
    )
    with torch.no_grad():
        model(torch.from_numpy(images))
    handle.remove()
    out = seen[0].numpy()
    return out.reshape(out.shape[0], -1, out.shape[-1])


def test_an_encoders_directory_is_read_and_the_oracle_gives_its_last_block(tmp_path):
    import torch

    model = _encoder()
    model.vision_encoder.neck = torch.nn.Identity()
    model.save_pretrained(tmp_path / "theirs", safe_serialization=True)
    state, config = hf.read_hf(tmp_path / "theirs")
    assert (config.window_size, config.global_attn_indexes, config.use_rel_pos) == (4, (1,), True)
    assert (config.class_token, config.final_norm, config.grid_size) == (False, False, (10, 10))
    images = make_images(config, 2, "ordinary", 0)
    oracle = numpy_vit.make(config, state)(images)["blocks.1"]
    theirs = _last_block(model, images)
    assert np.abs(theirs - oracle).max() <= 1e-5 * np.abs(oracle).max(), np.abs(theirs - oracle).max()
    # the companion: its position table read row for column (transposed on the grid) is not the encoder's
    table = state["pos_embed"].reshape(10, 10, -1).transpose(1, 0, 2).reshape(1, 100, -1)
    wrong = numpy_vit.make(config, {**state, "pos_embed": table})(images)["blocks.1"]
    assert np.abs(wrong - theirs).max() > 0.01 * np.abs(oracle).max()


def test_the_canonical_state_is_written_as_transformers_holds_it_and_read_back_bitwise(tmp_path):
    config = get_config("vit_test_sam").replace(num_classes=0, final_norm=False, img_size=24)  # SAM's are square
    from transformers import SamVisionModel

    state = init_state(config, seed=3)
    read = written_read_and_loaded(state, config, tmp_path / "ours", SamVisionModel, sam.to_sam, ".neck.")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "sam_vision_model"
    assert read == config.replace(fc_norm=None)  # fc_norm=False: the same, none before the mean


def test_its_neck_and_what_the_layout_cannot_hold_are_refused_by_name(tmp_path):
    neck = r"vision_encoder\.neck\.conv1\.weight.*neck \(two convolutions.*after the tower.*neck = torch\.nn\.Identity"
    refused_with_its_part_after_the_tower(_encoder(), tmp_path / "with_neck", neck)
    config = get_config("vit_test_sam").replace(num_classes=0, final_norm=False, img_size=24)
    with pytest.raises(WeightError, match="cannot hold img_size=\\(16, 24\\)"):
        sam.vit_config_to_sam(config.replace(img_size=(16, 24)))
    with pytest.raises(WeightError, match="cannot hold final_norm=True"):
        sam.vit_config_to_sam(config.replace(final_norm=True))
    with pytest.raises(WeightError, match="cannot hold num_classes=7"):
        sam.vit_config_to_sam(config.replace(num_classes=7))
