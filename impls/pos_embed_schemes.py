"""Which position table a config's tokens get, framework-free: each framework's position home
(impls/{numpy,torch,mlx,jax}_pos_embed.py) binds ``pos_table`` to its own resampling and fixed
tables, so a scheme's dispatch is written once and every model reads it from its framework's home."""

from __future__ import annotations


def pos_table(config, table, grid, num_tokens: int, *, fixed, resample):
    """The position table the tokens get under ``config.pos_embed`` at the images' ``grid``: the
    learned ``table`` resampled (``resample``: the framework's ``resample_pos_embed``), or a fixed
    one computed (``fixed``: the framework's ``FIXED``, name -> (whether it covers the prefix tokens,
    the table at (tokens, grid, width))); and whether it covers the prefix tokens as well as the
    patches (``num_tokens``, all of them). None: no table."""
    if config.pos_embed == "learn":
        n = config.num_prefix_tokens if config.prefix_pos else 0
        return resample(table, config.pos_grid, grid, n, config.pos_embed_interp_mode), config.prefix_pos
    if config.pos_embed == "none":
        return None
    covers_prefix, make = fixed[config.pos_embed]
    return make(num_tokens, grid, config.embed_dim), covers_prefix
