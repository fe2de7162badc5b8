"""A block's attention read from what the recorder saw (q, k, v, the weights, the bias), and a
read stage brought to its tap's shape: the part of capture that turns a model's own arrays into
the stages of impls/stages.py."""

from __future__ import annotations

import math

import numpy as np

from conformance.capture.sequence import heads_first


class Unseen(Exception):
    """The stage is not visible in this model's run (said why)."""


class Never(Exception):
    """The module that holds the stage's weights never ran: a finding about the port."""


def to_tap_shape(x, shape):
    """``x`` as the tap ``shape`` where it is that tap's tokens on a grid, (B, h, w, D) as (B, h w, D)
    (SAM's blocks and windows, channels-last), or its heads within the batch, (B H, N, d) as
    (B, H, N, d); otherwise as it is (a mismatch is the comparison's to report)."""
    if shape is None or x.shape == tuple(shape):
        return x
    grid = x.ndim == len(shape) + 1 and x.shape[0] == shape[0] and math.prod(x.shape[1:-1]) == shape[1]
    heads = x.ndim == len(shape) - 1 and x.shape[0] == shape[0] * shape[1]  # (B H, N, d): heads in the batch
    if (grid and x.shape[-1] == shape[-1]) or (heads and x.shape[1:] == tuple(shape[2:])):
        return x.reshape(shape)
    return x


def windowed_blocks(rec, tokens: int) -> dict[int, list[int]]:
    """The blocks whose fused attention was called on parts of an image's ``tokens`` (cu_seqlens
    windows, Qwen2.5-VL's), not on whole images: block -> the calls' token counts. One call per
    image, or one on the whole sequence, is not listed; nor is a call on no tokens."""
    found = {}
    for block, slot in rec.attn.items():
        if block is None or "chunks" not in slot or "q" not in slot:
            continue
        axis = -2 if slot.get("heads_first", True) else -3  # (..., H, L, hd) or (..., L, H, hd)
        counts = [int(np.shape(part)[axis]) for part in (slot["q"], *(ch["q"] for ch in slot["chunks"]))]
        counts = [n for n in counts if n]  # an empty call (a repeated cu_seqlens offset) attends nothing
        if any(n != tokens for n in counts):
            found[block] = counts
    return found


def read_attention(source, rec, config, as_numpy, first_array, shape=None):
    """q, k, v, the weights or the bias of a block as its attention record shows them
    (``as_numpy``: the captured forward's reader, which notes the dtype emitted; ``first_array``: a
    module's output's first array in its framework's terms; ``shape``: the
    stage's tap shape, whose leading size is a windowed block's windows)."""
    c = config
    lead = rec.B if shape is None else shape[0]
    slot = rec.attn.get(source.block, {})
    part = source.part
    if part == "weights":
        if "weights" in slot:
            return _heads4(as_numpy(slot["weights"]), c), "the softmax over keys"
        raise Unseen(
            f"computed inside {slot['fused']} (a fused kernel)"
            if "fused" in slot
            else f"computed inside {slot['native']}"
            if "native" in slot
            else "no softmax over (N, N) logits was seen in this block"
        )
    if part == "bias":
        if "bias" not in slot:
            raise Unseen("no fused attention call with a float mask was seen in this block (an explicit sum)")
        x = _heads4(as_numpy(slot["bias"]), c)
        return np.broadcast_to(x, (lead, *x.shape[-3:])), f"the additive mask of {slot['fused']}"
    if part in slot:
        x = as_numpy(slot[part])
        if "chunks" in slot:  # one fused call per image or window: their tokens joined in order
            x = np.concatenate([x, *(as_numpy(ch[part]) for ch in slot["chunks"])], 2 if slot["heads_first"] else 1)
        if not slot.get("heads_first", True):
            x = x.transpose(0, 2, 1, 3)  # (B, N, H, hd) -> (B, H, N, hd)
        return _heads4(x, c), slot["where"]
    product = {"q": "logits_q", "k": "logits_k", "v": "product_v"}[part]
    if part == "q" and "q_scaled" in slot:
        raise Unseen(
            f"scaled inside {slot['q_scaled']} before q kᵀ, where capture sees no multiply "
            "(need_weights=True; with need_weights=False q is an argument of the fused attention)"
        )
    if product in slot:
        what = {
            "q": "the left operand of q kᵀ (before any scalar scale)",
            "k": "the right operand of q kᵀ",
            "v": "the right operand of weights · v",
        }[part]
        return _heads4(as_numpy(slot[product]), c), what
    kind, path = source.fallback or ("", "")
    if kind == "heads" and path in rec.outputs:
        return heads_first(as_numpy(first_array(rec.outputs[path])), c), f"output of {path}, heads split"
    if kind == "qkv" and path in rec.outputs:
        tokens = c.num_tokens if shape is None else shape[2]
        x = as_numpy(first_array(rec.outputs[path]))
        x = x.reshape(lead, tokens, 3, c.num_heads, c.head_dim)[:, :, "qkv".index(part)].transpose(0, 2, 1, 3)
        return x, f"output of {path} split as timm's (3, H, hd): the port's own split is checked at attn.weights"
    if "native" in slot:
        raise Unseen(f"computed inside {slot['native']}")
    raise Unseen("no fused attention call, q kᵀ product or q/k/v projection was seen in this block")


def _heads4(x, config):
    if x.ndim == 3 and x.shape[0] % config.num_heads == 0:  # (B*H, N, last)
        x = x.reshape(-1, config.num_heads, *x.shape[1:])
    return x
