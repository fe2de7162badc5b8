"""Qwen2.5-VL's window attention (``window_partition='truncate'``): windows of ``window_size`` patches
cut at the image's edge, each token attending its own window's tokens (impls/windows.window_mask), and
its blocks' sequence in window order (conformance/capture/sequence.merge_order), each against
transformers' own ``get_vision_window_index``; the four models against the oracle."""

import numpy as np
import pytest

from conformance.capture.sequence import merge_order
from conformance.generators import make_images
from impls import ConfigError, ViTConfig, jax_vit, mlx_vit, numpy_vit, torch_vit
from impls.windows import window_mask
from weights import init_state

# (grid, window in patches): whole windows, windows cut at the bottom and right, a window over the image
GRIDS = [((4, 4), 2), ((6, 6), 4), ((6, 10), 4), ((8, 4), 8)]


def transformers_windows(grid, window: int):
    """transformers' window order of a (gh, gw) grid in 2 x 2 merge groups (patch size 1) as the
    row-major tokens of each window, in order (its cu_window_seqlens' spans)."""
    import torch
    from transformers.vision_utils import get_vision_window_index

    index, cu = get_vision_window_index(torch.tensor([[1, *grid]]), 2, window, 1)
    tokens = merge_order(grid, 2).reshape(-1, 4)[index.numpy()].reshape(-1)
    bounds = sorted(set(cu.tolist()))
    return [tokens[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("grid, window", GRIDS)
def test_the_window_order_and_the_windows_are_transformers_qwen2_5_vl(grid, window):
    windows = transformers_windows(grid, window)
    assert np.array_equal(merge_order(grid, 2, window), np.concatenate(windows))
    mask = np.zeros((grid[0] * grid[1],) * 2, bool)
    for w in windows:
        mask[np.ix_(w, w)] = True
    assert np.array_equal(window_mask(grid, window), mask)


def test_the_companions_windows_of_another_side_or_none_are_not_transformers():
    windows = transformers_windows((6, 6), 4)
    assert not np.array_equal(merge_order((6, 6), 2, 2), np.concatenate(windows))
    assert not np.array_equal(merge_order((6, 6), 2), np.concatenate(windows))
    assert window_mask((6, 6), 2).sum() != sum(len(w) ** 2 for w in windows)


CONFIG = ViTConfig(
    img_size=(24, 40), patch_size=4, embed_dim=32, depth=3, num_heads=2, class_token=False, global_pool="avg",
    num_classes=5, pos_embed="none", rope_type="cat", rope_rotate_half=True, norm_layer="rmsnorm",
    window_size=4, window_partition="truncate", global_attn_indexes=(2,),
)  # fmt: skip


@pytest.mark.parametrize("framework", [torch_vit, mlx_vit, jax_vit], ids=lambda m: m.FRAMEWORK)
def test_every_model_in_cut_windows_equals_the_oracle_at_every_stage_fused_or_not(framework):
    """A 6 x 10 grid in windows of 4 x 4 patches (cut at the bottom and the right), rotary embeddings
    at each token's place, the last block global: each port's taps and its fused forward's logits."""
    state, images = init_state(CONFIG, seed=1), make_images(CONFIG, 2, "ordinary", 1)
    oracle = numpy_vit.make(CONFIG, state)(images)
    taps = framework.make(CONFIG, state)(images)
    worst = {k: float(np.abs(np.asarray(taps[k], np.float64) - oracle[k]).max()) for k in oracle}
    assert max(worst.values()) < 1e-4, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    fused = framework.make(CONFIG, state, taps=False, fused_attn=True)(images)
    fused = fused["logits"] if isinstance(fused, dict) else fused
    assert np.abs(np.asarray(fused, np.float64) - oracle["logits"]).max() < 1e-4
    weights = np.asarray(taps["blocks.0.attn.weights"])
    assert np.count_nonzero(weights[0, 0, 0]) == 16 and np.count_nonzero(weights[0, 0, -1]) == 4  # a cut window's


def test_cut_windows_are_padded_ones_where_the_grid_holds_whole_windows_and_not_elsewhere():
    """On an 8 x 8 grid of 4 x 4 windows the two schemes attend the same tokens (no padding); on a
    6 x 10 grid the padded windows' zero tokens are keys too: the oracles differ from the first
    block's attention on (its output compared on the grid: a padded block's attention is in windows)."""
    whole = CONFIG.replace(img_size=32, rope_type=None, rope_rotate_half=False)
    for config, same in ((whole, True), (CONFIG.replace(rope_type=None, rope_rotate_half=False), False)):
        state, images = init_state(config, seed=2), make_images(config, 2, "ordinary", 2)
        cut = numpy_vit.make(config, state)(images)
        padded = numpy_vit.make(config.replace(window_partition="pad"), state)(images)
        assert np.allclose(cut["blocks.0"], padded["blocks.0"], atol=1e-12) == same
        assert np.allclose(cut["blocks.0.norm1"], padded["blocks.0.norm1"], atol=0)


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(window_size=0), "window_size"),
        (dict(class_token=True, global_pool="token"), "prefix token"),
        (dict(use_rel_pos=True), "use_rel_pos"),
        (dict(window_partition="cut"), "window_partition"),
    ],
)
def test_a_config_cut_windows_cannot_hold_is_refused_by_name(changes, named):
    with pytest.raises(ConfigError, match=named):
        CONFIG.replace(**changes)


@pytest.mark.parametrize("bug", ["softmax_without_max_float32", "softmax_in_bfloat16", "attention_scale_on_q_and_k"])
def test_a_class_of_how_the_softmax_is_computed_keeps_a_blocks_windows(bug):
    """A diagnosis class that computes a windowed block's attention weights another way computes
    them within each query's own window, as the oracle does: outside it they are zero. Before, these
    classes attended the whole image and a tower that ignores its windows (tests/test_vlm_towers.py)
    was named "the softmax as exp(l) / sum(exp(l)) in float32". The companion: windows_ignored's
    weights are not zero there."""
    from conformance.diagnosis.classes import BY_NAME, evaluate_variant

    state, images = init_state(CONFIG, seed=1), make_images(CONFIG, 1, "ordinary", 1)
    taps = numpy_vit.make(CONFIG, state)(images)
    outside = ~window_mask(CONFIG.grid_at(images.shape[2:]), CONFIG.window_size)
    name = "blocks.0.attn.weights"
    weights, _ = evaluate_variant(BY_NAME[bug], name, taps, images, state, CONFIG)
    assert weights.shape == taps[name].shape and np.all(weights[..., outside] == 0), bug
    assert np.abs(weights - taps[name]).max() < 0.05  # the class's own rounding, no more
    ignored, _ = evaluate_variant(BY_NAME["windows_ignored"], name, taps, images, state, CONFIG)
    assert np.abs(ignored[..., outside]).min() > 0
