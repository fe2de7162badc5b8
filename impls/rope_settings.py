"""What a config asks of its rotary position embedding, framework-free: the one place a port's
rope tables read the config (impls/{numpy,torch,mlx,jax}_pos_embed.py each compute the tables from
these in their framework), and which block's tables a block takes.

``rope_settings(config)`` is ``rope_angles``' keywords (timm's names: the kind, base, grid
offset and indexing, EVA02's reference grid, the head's width); None without a rotary embedding.
"""

from __future__ import annotations


def rope_settings(config) -> dict | None:
    """``rope_angles``' keywords for ``config``'s rotary embedding, or None without one."""
    if config.rope_type is None:
        return None
    return {
        "head_dim": config.head_dim,
        "kind": config.rope_type,
        "temperature": config.rope_temperature,
        "offset": config.rope_grid_offset,
        "indexing": config.rope_grid_indexing,
        "ref_feat_shape": config.ref_feat_shape,
    }


def block_rope(rope, i: int, config):
    """Block i's tables (a ``rope_tables``' answer): RoPE-Mixed's own, its frequencies being per
    block; the other kinds' shared by every block."""
    if rope is None or config.rope_type != "mixed":
        return rope
    return rope[0][i], rope[1][i]
