"""BEiT's relative position index (timm's ``gen_relative_position_index``), shared by the four
models: which row of a block's ``attn.relative_position_bias_table`` each (query, key) pair
reads. An integer table, computed once per grid; the models gather their bias with it in their
own framework.

For patches at (y1, x1) and (y2, x2) the row is (y1 - y2 + gh - 1) (2 gw - 1) + (x1 - x2 + gw - 1);
the class token (token 0) reads the last three rows: D - 3 as query, D - 2 as key, D - 1 with
itself, D = (2 gh - 1)(2 gw - 1) + 3.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=16)
def relative_position_index(grid: tuple[int, int]) -> np.ndarray:
    """(N, N) int64 with N = gh gw + 1, the class token first; read-only."""
    gh, gw = grid
    distance = (2 * gh - 1) * (2 * gw - 1) + 3
    coords = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")).reshape(2, -1)  # (2, gh gw)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)  # query minus key, (gh gw, gh gw, 2)
    rows = (rel[..., 0] + gh - 1) * (2 * gw - 1) + (rel[..., 1] + gw - 1)
    index = np.zeros((gh * gw + 1,) * 2, dtype=np.int64)
    index[1:, 1:] = rows
    index[0, 0:] = distance - 3  # the class token's query
    index[0:, 0] = distance - 2  # the class token as key
    index[0, 0] = distance - 1
    index.setflags(write=False)
    return index
