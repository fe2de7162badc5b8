"""A one-sequence batch brought back to the batch it packs: Pixtral's and Qwen2-VL's towers (and
Kimi-style ones) concatenate the images' patch tokens into one sequence and keep them apart with a
block-diagonal attention mask (or ``cu_seqlens``); their taps are (1, B N, ...) or (B N, ...),
not (B, N, ...). ``ModelPort(sequence="one")`` says so, and every tap read is unpacked here; and a
stage's heads brought to the canonical (B, H, N, hd)."""

from __future__ import annotations

import numpy as np

# ModelPort(sequence=...): a batch axis; one sequence of every image's tokens, row-major; or one
# sequence with each image's tokens in 2 x 2 merge groups (Qwen2-VL's: (h/2, w/2, 2, 2))
SEQUENCES = ("batch", "one", "merge2x2")
# ModelPort(prefix=...): the class and register tokens before the patches (timm's), or after them
# (Llama 4's vision tower appends its class token)
PREFIXES = ("first", "last")


def prefix_first(x: np.ndarray, symbols: str, prefix: int, tokens: int) -> np.ndarray:
    """A tap of a model that keeps its ``prefix`` tokens after the patches, in the canonical order
    (prefix first) on each axis of its ``tokens`` (``N``, or ``Nw`` outside windows, of the stage's
    shape ``symbols``); a tap not of that shape as it is (a mismatch is the comparison's to report)."""
    if not prefix or x.ndim != len(symbols.split()):
        return x
    axes = [a for a, s in enumerate(symbols.split()) if s in ("N", "Nw") and x.shape[a] == tokens]
    for axis in axes:
        x = np.roll(x, prefix, axis=axis)
    return x


def merge_order(grid, merge: int, window: int = 0) -> np.ndarray:
    """The row-major index of the token at each position of a merge-grouped sequence: groups of
    merge x merge neighbours, the groups row-major, each group row-major. ``window``: the groups
    in windows of that many patches a side, cut at the grid's edge, the windows row-major and the
    groups row-major within each (Qwen2.5-VL's window order, which its blocks run in)."""
    gh, gw = grid
    r, c, i, j = np.meshgrid(
        np.arange(gh // merge), np.arange(gw // merge), np.arange(merge), np.arange(merge), indexing="ij"
    )
    order = ((r * merge + i) * gw + c * merge + j).reshape(-1, merge * merge)
    if window and window % merge == 0:
        w, groups = window // merge, np.arange(order.shape[0]).reshape(gh // merge, gw // merge)
        rows, cols = groups.shape
        order = order[
            np.concatenate(
                [groups[a : a + w, b : b + w].reshape(-1) for a in range(0, rows, w) for b in range(0, cols, w)]
            )
        ]
    return order.reshape(-1)


def unpack_sequence(
    x: np.ndarray, batch: int, tokens: int, grid=None, merge: int = 1, weights: bool = False, window: int = 0
):
    """``unpack`` then, for a merge-grouped sequence (``merge`` > 1), each image's tokens brought to
    row-major order over its ``grid`` on every token axis (``weights``: the attention weights', both);
    ``window``: in Qwen2.5-VL's window order (``merge_order``)."""
    if x.ndim == 5 and sum(d != 1 for d in x.shape[1:]) == 1:  # a Conv3d's (N, D, 1, 1, 1) or MLX's (N, 1, 1, 1, D)
        x = x.reshape(x.shape[0], -1)
    x = unpack(x, batch, tokens, weights)
    if merge == 1 or grid is None or grid[0] * grid[1] != tokens:
        return x
    back = np.argsort(merge_order(grid, merge, window))  # the packed position of each row-major token
    if weights:  # queries and keys
        return x[:, :, back][:, :, :, back]
    return x[:, :, back] if x.ndim == 4 else x[:, back]


def unpack(x: np.ndarray, batch: int, tokens: int, weights: bool = False) -> np.ndarray:
    """``x`` as the batch of ``batch`` images of ``tokens`` tokens it packs: (1, B N, D) or (B N, D)
    to (B, N, D); q, k, v (1, H, B N, hd) to (B, H, N, hd); the attention weights (1, H, B N, B N)
    to each image's own block (a mask that leaks lowers them: the softmax spreads over the other
    images' keys). A tap already batched, (B, ...), is left as it is."""
    total = batch * tokens
    if x.ndim < 2 or x.shape[0] == batch != total:  # batched already
        return x
    if x.ndim == 4 and x.shape[0] == 1 and x.shape[2] == total:  # (1, H, B N, ...): heads first, whatever H is
        x = x[0]
        if weights:
            return np.stack([x[:, i * tokens : (i + 1) * tokens, i * tokens : (i + 1) * tokens] for i in range(batch)])
        return x.reshape(x.shape[0], batch, tokens, x.shape[2]).transpose(1, 0, 2, 3)
    x = x[0] if x.shape[0] == 1 and x.ndim > 2 else x  # the sequence's own batch axis, where it has one
    if x.shape[0] == total:  # tokens first: (B N, ...)
        return x.reshape(batch, tokens, *x.shape[1:])
    if weights and x.ndim == 3:  # (H, B N, B N): each image's block
        return np.stack([x[:, i * tokens : (i + 1) * tokens, i * tokens : (i + 1) * tokens] for i in range(batch)])
    if x.ndim == 3 and x.shape[1] == total:  # heads first: (H, B N, hd)
        return x.reshape(x.shape[0], batch, tokens, x.shape[2]).transpose(1, 0, 2, 3)
    return x


def heads_first(x: np.ndarray, c) -> np.ndarray:
    """A stage split into heads as the canonical taps hold them, (B, H, N, hd): from the model's
    (B, N, D) or (B, N, H, hd); anything else as it is."""
    if x.ndim == 3 and x.shape[-1] == c.embed_dim:  # (B, N, D) -> (B, H, N, hd)
        return x.reshape(x.shape[0], x.shape[1], c.num_heads, c.head_dim).transpose(0, 2, 1, 3)
    if x.ndim == 4 and x.shape[1:] == (c.num_tokens, c.num_heads, c.head_dim):  # (B, N, H, hd)
        return x.transpose(0, 2, 1, 3)
    return x
