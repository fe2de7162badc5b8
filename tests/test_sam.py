"""SAM's image encoder (timm's VisionTransformerSAM, transformers' SamVisionModel): its windows and
decomposed relative positions, the order written once (impls/windows.py), the oracle against timm's
model in float64 at every stage, and the companions that show each comparison can fail."""

import numpy as np
import pytest
import torch

from conformance.references import timm_state, timm_taps, timm_vit
from impls import get_config, tap_names, tap_shapes
from impls import numpy_vit as O
from impls.windows import num_windows, rel_pos_index, token_index, window_index
from weights import init_state


@pytest.mark.parametrize("grid, w", [((4, 6), 3), ((5, 7), 3), ((2, 2), 4), ((6, 6), 2)])
def test_windows_cover_the_grid_once_and_come_back_in_place(grid, w):
    """Each token in exactly one window position, the rest padding (one past the last token); the
    windows row-major, each row-major inside; the unpartition its inverse."""
    index, inverse = window_index(grid, w), token_index(grid, w)
    n = grid[0] * grid[1]
    assert len(index) == num_windows(grid, w) * w * w
    assert sorted(index[index < n]) == list(range(n)) and set(index[index >= n]) <= {n}
    assert np.array_equal(index[inverse], np.arange(n))
    assert list(index[:w]) == list(range(w)) if grid[1] >= w else True  # the first window's first row
    x = np.random.default_rng(0).normal(size=(2, n, 3))
    assert np.array_equal(O.window_unpartition(O.window_partition(x, grid, w), grid, w), x)


def test_a_window_partition_in_column_major_order_does_not_come_back():
    """The companion: windows taken column-major but put back row-major scramble the tokens."""
    grid, w = (4, 6), 2
    x = np.random.default_rng(0).normal(size=(1, 24, 3))
    windows = x.reshape(1, 2, 2, 3, 2, 3).transpose(0, 3, 1, 2, 4, 5).reshape(-1, 4, 3)  # (wx, wy): wrong
    assert not np.array_equal(O.window_unpartition(windows, grid, w), x)


def test_rel_pos_index_is_query_minus_key():
    assert rel_pos_index(3).tolist() == [[2, 1, 0], [3, 2, 1], [4, 3, 2]]


def _timm_sam(config, seed=3):
    torch.manual_seed(0)
    model = timm_vit(config, init_state(config, seed=seed)).double()
    x = np.random.default_rng(1).normal(size=(2, config.in_chans, *config.img_size)).astype(np.float32)
    return model, timm_state(model), x


@pytest.mark.parametrize("changes", [{}, dict(qk_norm=True, init_values=0.1, img_size=(24, 40), window_size=4)])
def test_oracle_equals_timms_sam_in_float64_at_every_stage(changes):
    """timm's VisionTransformerSAM without its neck (neck_chans=0: a final norm in its place),
    windows padded or not, with qk-norm and LayerScale: every stage to 1e-12 of the oracle's."""
    config = get_config("vit_test_sam").replace(**changes)
    model, state, x = _timm_sam(config)
    ref = timm_taps(model, x.astype(np.float64), tap_shapes(config, len(x)))
    out = O.make(config, state)(x)
    assert sorted(ref) == sorted(tap_names(config))
    worst = {k: float(np.abs(np.asarray(out[k]) - ref[k]).max() / np.abs(ref[k]).max()) for k in ref}
    assert max(worst.values()) < 1e-12, worst


def test_the_timm_sam_comparison_fails_at_the_bias_on_swapped_tables():
    """The companion: the oracle given rel_pos_h where rel_pos_w goes (and back) differs from timm
    first at block 0's decomposed bias; its attention's q, k and v still agree."""
    config = get_config("vit_test_sam")
    model, state, x = _timm_sam(config)
    ref = timm_taps(model, x.astype(np.float64), tap_shapes(config, len(x)))
    swapped = dict(state)
    swapped["blocks.0.attn.rel_pos_h"], swapped["blocks.0.attn.rel_pos_w"] = (
        state["blocks.0.attn.rel_pos_w"],
        state["blocks.0.attn.rel_pos_h"],
    )
    out = O.make(config, swapped)(x)
    differ = [k for k in tap_names(config) if not np.allclose(np.asarray(out[k]), ref[k], rtol=1e-9, atol=1e-12)]
    assert differ[0] == "blocks.0.attn.rel_pos", differ
