"""A one-sequence batch brought back to the batch it packs: Pixtral's and Qwen2-VL's towers (and
Kimi-style ones) concatenate the images' patch tokens into one sequence and keep them apart with a
block-diagonal attention mask (or ``cu_seqlens``); their taps are (1, B N, ...) or (B N, ...),
not (B, N, ...). ``ModelPort(sequence="one")`` says so, and every tap read is unpacked here."""

from __future__ import annotations

import numpy as np

SEQUENCES = ("batch", "one")  # ModelPort(sequence=...): a batch axis, or one sequence of every image's tokens


def unpack_sequence(x: np.ndarray, batch: int, tokens: int) -> np.ndarray:
    """``x`` as the batch of ``batch`` images of ``tokens`` tokens it packs: (1, B N, D) or (B N, D)
    to (B, N, D); q, k, v (1, H, B N, hd) to (B, H, N, hd); the attention weights (1, H, B N, B N)
    to each image's own block (a mask that leaks lowers them: the softmax spreads over the other
    images' keys). A tap already batched, (B, ...), is left as it is."""
    total = batch * tokens
    if batch == 1 or x.ndim < 2 or x.shape[0] == batch != total:
        return x
    x = x[0] if x.shape[0] == 1 else x  # the sequence's own batch axis, where it has one
    if x.shape[0] == total:  # tokens first: (B N, ...)
        return x.reshape(batch, tokens, *x.shape[1:])
    if x.ndim == 3 and x.shape[1:] == (total, total):  # weights (H, B N, B N): each image's block
        return np.stack([x[:, i * tokens : (i + 1) * tokens, i * tokens : (i + 1) * tokens] for i in range(batch)])
    if x.ndim == 3 and x.shape[1] == total:  # heads first: (H, B N, hd)
        return x.reshape(x.shape[0], batch, tokens, x.shape[2]).transpose(1, 0, 2, 3)
    return x
