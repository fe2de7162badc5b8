"""SAM's windows and decomposed relative positions (timm's ``vision_transformer_sam.py``), as
integer tables shared by the four models: each gathers with them in its own framework, so a
window's order is written once.

A windowed block reads the normed tokens as their (gh, gw) grid, zero-padded at the bottom and
right to whole ``w`` x ``w`` windows (the padding's tokens attend and are attended, as SAM's do),
and attends window by window: windows row-major over the padded grid, each window's tokens
row-major, the windows of one image together (timm's ``window_partition``: (B nW, w w, D)).
Its attention's output goes back to the grid, the padding dropped (``window_unpartition``).

Qwen2.5-VL's windows (``window_partition='truncate'``) are cut at the image's edge instead: no
padding, no partition; each token attends the tokens of its own window of the grid (``window_mask``).

Decomposed relative positions (MViTv2, SAM): for a query at (y, x) of an (S_h, S_w) grid (a
window, or the patch grid in a global block) and a key at (y', x'), the logits add
q · rel_pos_h[y - y' + S_h - 1] + q · rel_pos_w[x - x' + S_w - 1] (q unscaled, after qk-norm).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def _padded(grid: tuple[int, int], w: int) -> tuple[int, int]:
    return -(-grid[0] // w) * w, -(-grid[1] // w) * w


@lru_cache(maxsize=32)
def window_index(grid: tuple[int, int], w: int) -> np.ndarray:
    """(nW w w,) int64: the token each window position reads, row-major tokens of a (gh, gw) grid,
    gh gw (one past the last token) where it is padding; read-only."""
    gh, gw = grid
    hp, wp = _padded(grid, w)
    y, x = np.meshgrid(np.arange(hp), np.arange(wp), indexing="ij")
    token = np.where((y < gh) & (x < gw), y * gw + x, gh * gw)  # (hp, wp)
    index = token.reshape(hp // w, w, wp // w, w).transpose(0, 2, 1, 3).reshape(-1)
    index.setflags(write=False)
    return index


@lru_cache(maxsize=32)
def token_index(grid: tuple[int, int], w: int) -> np.ndarray:
    """(gh gw,) int64: where each token sits in its image's windows laid end to end; read-only."""
    index = window_index(grid, w)
    inverse = np.empty(grid[0] * grid[1], dtype=np.int64)
    real = index < len(inverse)
    inverse[index[real]] = np.flatnonzero(real)
    inverse.setflags(write=False)
    return inverse


def num_windows(grid: tuple[int, int], w: int) -> int:
    hp, wp = _padded(grid, w)
    return (hp // w) * (wp // w)


@lru_cache(maxsize=32)
def rel_pos_index(size: int) -> np.ndarray:
    """(S, S) int64: the row of a (2 S - 1)-row table for query position i and key position j,
    i - j + S - 1 (timm's ``get_rel_pos`` where the query's and key's sizes agree); read-only."""
    index = np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1
    index.setflags(write=False)
    return index


@lru_cache(maxsize=32)
def window_mask(grid: tuple[int, int], w: int) -> np.ndarray:
    """(gh gw, gh gw) bool: whether the token at each row (row-major over the grid) attends the
    token at each column, both in one ``w`` x ``w`` window of windows cut at the grid's edge
    (Qwen2.5-VL's); read-only."""
    y, x = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
    window = (y // w) * -(-grid[1] // w) + x // w
    mask = window[:, None] == window[None, :]
    mask.setflags(write=False)
    return mask


def block_grid(grid, i: int, config) -> dict:
    """Block ``i``'s call's keywords: the tokens' ``grid`` where it attends in windows (none else:
    a block swapped in need not take it)."""
    return {"grid": grid} if config.block_window(i) or config.block_window_cut(i) else {}


def rel_pos_args(config, i: int) -> dict:
    """Block ``i``'s attention's keywords for SAM's decomposed relative positions (timm's
    ``use_rel_pos`` and ``input_size``: its window's grid, or the patch grid's)."""
    return {"use_rel_pos": True, "input_size": config.rel_pos_grid(i)} if config.use_rel_pos else {}
