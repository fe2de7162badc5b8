"""transformers' Qwen2.5-VL vision tower's layout (weights/hf/qwen2_5_vl.py): its save_pretrained
directory, merger left out, read (config inferred, the Conv3d's two frames summed) and the oracle
giving its last block; canonical -> transformers -> canonical bitwise; its merger and what the
layout cannot hold refused by name."""

import json

import numpy as np
import pytest

from conformance.capture.sequence import merge_order
from conformance.generators import make_images
from impls import get_config, numpy_vit
from weights import hf, init_state
from weights.canonical import WeightError
from weights.hf import qwen2_5_vl
from tests.hf_layouts import drawn, refused_with_its_part_after_the_tower, written_read_and_loaded

# 4-pixel patches in windows of 16 pixels (4 x 4 patches: 2 x 2 merge groups), on a 6 x 6 grid those at the
# bottom and right cut to 2 patches; the last block global
SETTINGS = dict(
    depth=2, hidden_size=32, hidden_act="silu", intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
    spatial_merge_size=2, temporal_patch_size=2, window_size=16, out_hidden_size=32, fullatt_block_indexes=[1],
)  # fmt: skip


def _tower(seed: int = 0):
    """transformers' tower for SETTINGS, every parameter drawn (its two frames' kernels apart), its merger
    an identity (what verify's ModelPort(tower=...) leaves out of scope)."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    return drawn(Qwen2_5_VisionTransformerPretrainedModel._from_config(Qwen2_5_VLVisionConfig(**SETTINGS)), seed)


def _last_block(model, images: np.ndarray) -> np.ndarray:
    """The tower's last block's tokens for (B, C, H, W) images, as Qwen2-VL's processor gives them
    (two identical frames, 2 x 2 merge groups), brought back to each image's row-major grid."""
    import torch

    B, C, H, W = images.shape
    p, T, m = SETTINGS["patch_size"], SETTINGS["temporal_patch_size"], SETTINGS["spatial_merge_size"]
    gh, gw = H // p, W // p
    x = torch.from_numpy(images)[:, None].expand(B, T, C, H, W)
    x = x.reshape(B, T, C, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    seen = []
    handle = model.blocks[-1].register_forward_hook(lambda mod, args, out: seen.append(out.detach().numpy()))
    with torch.no_grad():
        model(x.reshape(B * gh * gw, C * T * p * p), torch.tensor([[1, gh, gw]] * B))
    handle.remove()
    back = np.argsort(merge_order((gh, gw), m, SETTINGS["window_size"] // p))
    return seen[0].reshape(B, gh * gw, -1)[:, back]


def test_a_towers_directory_is_read_and_the_oracle_gives_its_last_block(tmp_path):
    """Its config.json read as the windows it has (cut at the edge, in patches), its frames summed:
    the float64 oracle on the imported state gives the last block transformers computes (in float32)."""
    model = _tower()
    model.merger = __import__("torch").nn.Identity()
    model.save_pretrained(tmp_path / "theirs", safe_serialization=True)
    state, config = hf.read_hf(tmp_path / "theirs")
    assert (config.window_size, config.window_partition, config.global_attn_indexes) == (4, "truncate", (1,))
    assert (config.norm_layer, config.mlp_layer, config.rope_type, config.final_norm) == (
        "rmsnorm",
        "swiglu",
        "cat",
        False,
    )
    config = config.replace(img_size=24)
    images = make_images(config, 2, "ordinary", 0)
    oracle = numpy_vit.make(config, state)(images)["blocks.1"]
    theirs = _last_block(model, images)
    assert np.abs(theirs - oracle).max() <= 1e-5 * np.abs(oracle).max(), np.abs(theirs - oracle).max()
    # the companion: the kernel of the first frame alone is not the tower's
    wrong = {**state, "patch_embed.proj.weight": model.patch_embed.proj.weight.detach().numpy()[:, :, 0]}
    assert np.abs(numpy_vit.make(config, wrong)(images)["blocks.1"] - theirs).max() > 0.1 * np.abs(oracle).max()


def test_the_canonical_state_is_written_as_transformers_holds_it_and_read_back_bitwise(tmp_path):
    config = get_config("vit_test_qwen2_5_vl").replace(num_classes=0, img_size=16, dynamic_img_size=True)
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    state, model_cls = init_state(config, seed=3), Qwen2_5_VisionTransformerPretrainedModel
    read = written_read_and_loaded(state, config, tmp_path / "ours", model_cls, qwen2_5_vl.to_qwen2_5_vl, "merger.")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "qwen2_5_vl_vision" and written["window_size"] == 16
    assert read == config.replace(img_size=qwen2_5_vl.IMG_SIZE)


def test_its_merger_and_what_the_layout_cannot_hold_are_refused_by_name(tmp_path):
    merger = r"merger\.ln_q\.weight.*merger \(its projector.*after the tower.*model\.merger = torch\.nn\.Identity"
    refused_with_its_part_after_the_tower(_tower(), tmp_path / "with_merger", merger)
    with pytest.raises(WeightError, match="window_size 12 is not a whole number of 2 x 2 merge groups"):
        qwen2_5_vl.qwen2_5_vl_config_to_vit({**SETTINGS, "window_size": 12})
    config = get_config("vit_test_qwen2_5_vl").replace(num_classes=0)
    with pytest.raises(WeightError, match="cannot hold final_norm=True"):
        qwen2_5_vl.vit_config_to_qwen2_5_vl(config.replace(final_norm=True))
    with pytest.raises(WeightError, match="cannot hold num_classes=7"):
        qwen2_5_vl.vit_config_to_qwen2_5_vl(config.replace(num_classes=7))
