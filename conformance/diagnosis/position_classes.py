"""The bug classes of positions: the learned table's (added once, at ``embed``), the rotary
embeddings' (timm's Eva) and BEiT's relative position bias, each as the oracle computes it from
a stage's inputs (``conformance.diagnosis.classes`` is the registry)."""

from __future__ import annotations

import numpy as np

from conformance.diagnosis.bugclass import QUIET, BugClass
from conformance.numerics.precision import rounded
from conformance.numerics.error_model import prefix_tokens

from impls import numpy_pos_embed as R
from impls.numpy_vit import resample_pos_embed
from impls.protocol import ViTConfig
from impls.relative_position import relative_position_index
from impls.rope_settings import block_rope, rope_settings
from impls.stages import stage_inputs, stage_kind
from weights.resample import aa_matrix, cubic

_ROPE = ("attn.q_rope", "attn.k_rope")


def _class_token_without_pos_embed(name, t, images, s, config):
    if name != "embed":
        return None
    x = t[stage_inputs("embed", config)[0]] + s["pos_embed"][:, config.num_prefix_tokens :]
    cls = np.broadcast_to(s["cls_token"], (x.shape[0], 1, x.shape[2]))
    return np.concatenate([cls, x], 1)


def _prefix_tokens_last(name, t, images, s, config, precision=QUIET):
    """The class and register tokens after the patches, the table (where it has their rows) added
    in its canonical order: a model that keeps them last (Llama 4's tower) verified as timm's. Its
    bound: the sum's rounding and the table's storage, at each token where they land."""
    if name != "embed":
        return None
    x = t[stage_inputs("embed", config)[0]]
    prefix, pos = prefix_tokens(s, x.shape[0]), np.asarray(s.get("pos_embed", 0.0))
    if config.no_embed_class:
        y = np.concatenate([x + pos] + prefix, 1)
        pos = np.concatenate([np.broadcast_to(pos, x.shape)] + [np.zeros_like(p) for p in prefix], 1)
    else:
        y = np.concatenate([x] + prefix, 1) + pos
    return y, (precision.output * np.abs(y) + precision.storage * np.abs(pos) if precision.bounds else None)


_prefix_tokens_last.bounded = True


def _pos_embed_not_offset(name, t, images, s, config):
    """The patch tokens given the position embedding's first entries (``pos_embed[:, :num_patches]``,
    the prefix tokens' included) and the prefix tokens none: a layout where the table covers the
    patches alone (no_embed_class) read on one that covers the prefix tokens too."""
    if name != "embed":
        return None
    x = t[stage_inputs("embed", config)[0]]
    prefix = prefix_tokens(s, x.shape[0])
    return np.concatenate(prefix + [x + s["pos_embed"][:, : x.shape[1]]], 1)


def _registers_without_pos_embed(name, t, images, s, config):
    """The registers inserted after the position embedding was added to the class and patch tokens:
    the registers get no position entries (the class token and the patches theirs)."""
    if name != "embed":
        return None
    x, pos = t[stage_inputs("embed", config)[0]], s["pos_embed"]
    cls = np.broadcast_to(s["cls_token"], (x.shape[0], 1, x.shape[2])) + pos[:, :1]
    regs = np.broadcast_to(s["reg_token"], (x.shape[0], *s["reg_token"].shape[1:]))
    return np.concatenate([cls, regs, x + pos[:, config.num_prefix_tokens :]], 1)


def _learned(config) -> bool:
    return config.pos_embed == "learn"


def _pos_embed_scaled(factor: float):
    def state(s, config):
        return {"pos_embed": factor * s["pos_embed"]}

    return state


def _plain_matrix(n_in: int, n_out: int, mode: str) -> np.ndarray:
    """(n_out, n_in): torch's interpolate(mode=mode, align_corners=False) without antialias along
    one axis: bicubic's cubic with a = -0.75, four taps at the input's scale, edges replicated;
    bilinear's two taps, the source position clamped at 0."""
    R = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = (i + 0.5) * n_in / n_out - 0.5
        if mode == "bilinear":
            src = max(src, 0.0)
            x0 = int(src)
            R[i, x0] += 1.0 - (src - x0)
            R[i, min(x0 + 1, n_in - 1)] += src - x0
            continue
        x0 = int(np.floor(src))
        for j in range(x0 - 1, x0 + 3):
            R[i, min(max(j, 0), n_in - 1)] += cubic(np.asarray(src - j), -0.75)
    return R


def _resampled_by(matrix):
    """``embed`` with the table resampled to the images' grid by ``matrix(n_in, n_out, mode)`` along
    each axis (None where the grid is the table's own: no resampling to get wrong)."""

    def stage(name, t, images, s, config):
        grid = config.grid_at(images.shape[2:])
        if name != "embed" or grid == config.pos_grid:
            return None
        n = 0 if config.no_embed_class else config.num_prefix_tokens
        pos = s["pos_embed"]
        (gh, gw), D = config.pos_grid, pos.shape[-1]
        table = pos[:, n:].reshape(pos.shape[0], gh, gw, D)
        Rh, Rw = (matrix(o, g, config.pos_embed_interp_mode) for o, g in ((gh, grid[0]), (gw, grid[1])))
        new = np.einsum("ih,bhwd,jw->bijd", Rh, table, Rw).reshape(pos.shape[0], -1, D)
        return _embedded(np.concatenate([pos[:, :n], new], 1), t, s, config)

    return stage


_pos_embed_without_antialias = _resampled_by(_plain_matrix)
_pos_embed_align_corners = _resampled_by(lambda n_in, n_out, mode: aa_matrix(n_in, n_out, mode, align_corners=True))


def _embedded(pos, t, s, config):
    """``embed`` given the position entries ``pos`` (the prefix tokens' first, if any)."""
    x = t[stage_inputs("embed", config)[0]]
    prefix = prefix_tokens(s, x.shape[0])
    if config.no_embed_class:
        return np.concatenate(prefix + [x + pos], 1)
    return np.concatenate(prefix + [x], 1) + pos


def _pos_embed_grid_swapped(name, t, images, s, config):
    """The table resampled to the images' grid with its axes swapped, (columns, rows), and laid over
    the patches row-major: a packed batch's patch coordinates read as (x, y), or a table reshaped
    (gw, gh)."""
    grid = config.grid_at(images.shape[2:])
    if name != "embed" or grid[0] == grid[1]:
        return None
    n = 0 if config.no_embed_class else config.num_prefix_tokens
    pos = resample_pos_embed(s["pos_embed"], config.pos_grid, grid[::-1], n, config.pos_embed_interp_mode)
    return _embedded(pos, t, s, config)


def _table_bound(y, angle, precision):
    """A fixed table added once: the sum rounded in the dtype, the table's angle and its sine or
    cosine each to a few units of float32 (the dtype ports compute tables in); ``angle`` the largest
    angle at each token."""
    return precision.output * np.abs(y) + 4 * 2.0**-24 * (1.0 + angle) if precision.bounds else None


def sincos_2d_mae(grid, dim: int) -> np.ndarray:
    """MAE's get_2d_sincos_pos_embed, (gh * gw, dim): [sin, cos] of the column over half the
    channels, then of the row (its meshgrid puts w first), w_i = 10000 ** (-i / (dim / 4))."""

    def one_axis(pos):
        omega = 1.0 / 10000.0 ** (np.arange(dim // 4) / (dim / 4))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    w, h = np.meshgrid(np.arange(grid[1], dtype=np.float64), np.arange(grid[0], dtype=np.float64))
    return np.concatenate([one_axis(w), one_axis(h)], axis=1)


def _pos_embed_sincos_mae(name, t, images, s, config, precision=QUIET):
    """MAE's fixed 2-D table on the patches (its class token's entry zero) in place of the learned one."""
    if name != "embed":
        return None
    x = t[stage_inputs("embed", config)[0]]
    grid = config.grid_at(images.shape[2:])
    y = np.concatenate(prefix_tokens(s, x.shape[0]) + [x + sincos_2d_mae(grid, x.shape[2])[None]], 1)
    return y, _table_bound(y, max(grid), precision)


_pos_embed_sincos_mae.bounded = True


def _pos_embed_table_cropped(name, t, images, s, config):
    """A table of a larger grid cropped to the images' grid at its top left corner, not resampled."""
    grid = config.grid_at(images.shape[2:])
    (gh, gw) = config.pos_grid
    if name != "embed" or grid == (gh, gw) or grid[0] > gh or grid[1] > gw:
        return None
    n, pos = 0 if config.no_embed_class else config.num_prefix_tokens, s["pos_embed"]
    table = pos[:, n:].reshape(pos.shape[0], gh, gw, -1)[:, : grid[0], : grid[1]]
    return _embedded(np.concatenate([pos[:, :n], table.reshape(pos.shape[0], -1, pos.shape[-1])], 1), t, s, config)


def _resampled(c: ViTConfig) -> bool:
    """A learned table that meets images of other grids."""
    return c.dynamic_img_size and _learned(c)


def _sincos_able(c: ViTConfig) -> bool:
    """A learned table at the images' grid the fixed one could stand for (a NaFlex table's own grid it cannot)."""
    return _learned(c) and c.pos_embed_grid_size is None and c.embed_dim % 4 == 0 and c.embed_dim >= 8


def _rope(config: ViTConfig) -> bool:
    return config.rope_type is not None


def _rope_banded(config: ViTConfig) -> bool:
    """A rotation of bands from a base (RoPE-Mixed's frequencies are learned, its pairs neighbours)."""
    return config.rope_type in ("cat", "dinov3")


_GRID_HINT = "timm's rope_grid_indexing: 'ij' reads the grid's coordinates as (row, column), 'xy' as (column, row)"
_PAIRS_HINT = (
    "timm's rope_rotate_half (mlx.nn.RoPE's traditional=False) turns x_i with x_(i + hd/2); "
    "interleaved (traditional=True) turns neighbours x_2i, x_2i+1"
)


def _rotation_inputs(name, t, images, s, config):
    """What a rotary stage reads: q or k before it, and its block's sin and cos at the images' grid."""
    grid = config.grid_at(images.shape[2:])
    sin, cos = block_rope(R.rope_tables(config, grid, s.get("rope.freqs")), int(name.split(".")[1]), config)
    return t[stage_inputs(name, config)[0]], sin, cos


def _rope_sin_cos_swapped(name, t, images, s, config):
    """q or k turned with the tables' sin and cos exchanged: x sin + rot(x) cos."""
    if stage_kind(name) not in _ROPE:
        return None
    x, sin, cos = _rotation_inputs(name, t, images, s, config)
    return R.rotate_tokens(x, (cos, sin), config.num_prefix_tokens, config.rope_rotate_half)


def _rope_frequencies_in(dtype: str):
    """q or k turned by angles from frequencies rounded to ``dtype``: a fixed ``inv_freq`` buffer cast
    with the weights (``model.to(dtype)``), position x frequency off by |angle| u, most at the far
    patches."""

    def stage(name, t, images, s, config):
        if stage_kind(name) not in _ROPE:
            return None
        settings = rope_settings(config)
        bands = R.rope_bands(settings["head_dim"], settings["kind"], settings["temperature"])
        # the angles' columns: the first axis's bands, then the second's (Pixtral's, its own per axis)
        share = (
            (rounded(bands, dtype) / bands).reshape(-1)
            if bands.ndim == 2
            else np.tile(rounded(bands, dtype) / bands, 2)
        )
        angles = R.config_angles(config, config.grid_at(images.shape[2:])) * share
        rope = R.rope_embed(angles, config.rope_rotate_half)
        return R.rotate_tokens(
            t[stage_inputs(name, config)[0]], rope, config.num_prefix_tokens, config.rope_rotate_half
        )

    return stage


def _rope_fixed(config: ViTConfig) -> bool:
    """Frequencies the model computes, not learned weights (RoPE-Mixed's)."""
    return config.rope_type is not None and config.rope_type != "mixed"


def _rope_from_first_token(name, t, images, s, config):
    """q or k rotated from the sequence's first token: the prefix by the first patches' angles, the
    last patches as they are."""
    if stage_kind(name) not in _ROPE:
        return None
    x, sin, cos = _rotation_inputs(name, t, images, s, config)
    pad = (*sin.shape[:-2], config.num_prefix_tokens, sin.shape[-1])  # the prefix's rows: no rotation
    sin = np.concatenate([sin, np.zeros(pad)], axis=-2)
    cos = np.concatenate([cos, np.ones(pad)], axis=-2)
    return R.rotate_tokens(x, (sin, cos), 0, config.rope_rotate_half)


def _rel_pos_bias(index_of, heads_of=lambda table: table):
    """BEiT's bias gathered another way: ``index_of`` the (N, N) index, ``heads_of`` the table."""

    def stage(name, t, images, s, config):
        if stage_kind(name) != "attn.rel_pos_bias":
            return None
        grid = config.grid_at(images.shape[2:])
        table = heads_of(s[f"{name.rsplit('.', 1)[0]}.relative_position_bias_table"])
        y = table[index_of(relative_position_index(grid))].transpose(2, 0, 1)
        return np.broadcast_to(y, (images.shape[0], config.num_heads, *y.shape[1:]))

    return stage


def _rel(config: ViTConfig) -> bool:
    return config.rel_pos_bias


_REL = ("attn.rel_pos_bias",)
_INDEX_HINT = (
    "timm's gen_relative_position_index: coords[:, :, None] - coords[:, None, :] (query minus key), the "
    "class token's query row D - 3, its key column D - 2, itself D - 1"
)

# fmt: off
TABLE_CLASSES: tuple[BugClass, ...] = (
    # embeddings
    BugClass("pos_embed_missing", ("embed",), "no position embedding", "add pos_embed to the tokens",
             state=_pos_embed_scaled(0.0), when=_learned),
    BugClass("pos_embed_added_twice", ("embed",), "the position embedding added twice",
             "add pos_embed once", state=_pos_embed_scaled(2.0), when=_learned),
    BugClass("class_token_without_pos_embed", ("embed",),
             "the class token prepended after the position embedding (big_vision's order)",
             "timm adds pos_embed[:, 0] to the class token: prepend it, then add the position embedding",
             stage=_class_token_without_pos_embed, when=lambda c: c.class_token and c.prefix_pos),
    BugClass("pos_embed_not_offset_by_prefix", ("embed",),
             "the patch tokens given the position embedding's first entries (pos_embed[:, :num_patches]), "
             "the class and register tokens none",
             "with no_embed_class=False pos_embed covers the prefix tokens first: the patches take "
             "pos_embed[:, num_prefix_tokens:]",
             stage=_pos_embed_not_offset, when=lambda c: c.num_prefix_tokens > 0 and c.prefix_pos),
    BugClass("registers_without_pos_embed", ("embed",),
             "the registers inserted after the position embedding was added (no position entries)",
             "with no_embed_class=False timm concatenates [cls, registers, patches], then adds pos_embed: "
             "the registers take pos_embed[:, 1:1 + reg_tokens]",
             stage=_registers_without_pos_embed,
             when=lambda c: c.reg_tokens > 0 and c.class_token and c.prefix_pos),
    BugClass("prefix_tokens_last", ("embed",),
             "the class and register tokens after the patches (Llama 4's vision tower appends its class token)",
             "timm's come first; a model that keeps them last by design says so, ModelPort(prefix='last'): its "
             "taps are read in the canonical order, rename= lays the table's prefix rows last",
             stage=_prefix_tokens_last,
             when=lambda c: c.num_prefix_tokens > 0 and c.pos_embed in ("learn", "none") and not c.dynamic_img_size),
    BugClass("pos_embed_resampled_without_antialias", ("embed",),
             "the position grid resampled without antialias (bicubic, or bilinear with pos_embed_interp_mode)",
             "timm's resample_abs_pos_embed uses F.interpolate(mode='bicubic', antialias=True); NaFlex's and "
             "SigLIP 2's resizes are antialiased too",
             stage=_pos_embed_without_antialias, when=_resampled),
    BugClass("pos_embed_resampled_align_corners", ("embed",),
             "the position grid resampled with align_corners=True (the corners' centres on each other)",
             "timm and transformers resample the table with F.interpolate(..., align_corners=False, antialias=True)",
             stage=_pos_embed_align_corners, when=_resampled),
    # a position embedding of another kind in place of the learned table (issue 45; seed post 004's)
    BugClass("pos_embed_sinusoidal_1d", ("embed",),
             "the Transformer paper's 1-D sinusoidal table over the sequence in place of the learned one",
             "a ViT's table is learned (timm's pos_embed, loaded from the checkpoint); a model meant to use "
             "the paper's encoding says pos_embed='sinusoid'", config={"pos_embed": "sinusoid"}, when=_learned),
    BugClass("pos_embed_sincos_2d", ("embed",),
             "SimpleViT's fixed 2-D sin-cos table in place of the learned one",
             "load the checkpoint's pos_embed; a model meant to use the fixed table says pos_embed='sincos'",
             config={"pos_embed": "sincos"}, when=_sincos_able),
    BugClass("pos_embed_sincos_2d_mae", ("embed",),
             "MAE's fixed 2-D sin-cos table (get_2d_sincos_pos_embed) in place of the learned one",
             "load the checkpoint's pos_embed (MAE's own checkpoints hold that table)",
             stage=_pos_embed_sincos_mae, when=_sincos_able),
    BugClass("pos_embed_table_cropped", ("embed",),
             "a table of a larger grid cropped to the images' grid at its top left, not resampled",
             "resample the table to the images' grid (timm's resample_abs_pos_embed, bicubic with antialias)",
             stage=_pos_embed_table_cropped, when=_resampled),
    BugClass("pos_embed_grid_swapped", ("embed",),
             "the position table resampled to the grid with its axes swapped, (columns, rows)",
             "a grid is (rows, columns): timm's patch_coord is (y, x), transformers' spatial_shapes (height, width)",
             stage=_pos_embed_grid_swapped, when=_resampled),
)
POSITION_CLASSES: tuple[BugClass, ...] = (
    # rotary position embeddings (timm's Eva)
    BugClass("rope_grid_xy", _ROPE, "the rotary grid's axes swapped: (column, row) where the model has (row, column)",
             _GRID_HINT, config={"rope_grid_indexing": "xy"}, when=_rope),
    BugClass("rope_grid_ij", _ROPE, "the rotary grid's axes swapped: (row, column) where the model has (column, row)",
             _GRID_HINT, config={"rope_grid_indexing": "ij"}, when=_rope),
    BugClass("rope_sin_cos_swapped", _ROPE, "the rotation with sin and cos exchanged: x sin + rot(x) cos",
             "x cos + rot(x) sin: a table laid out [cos, sin] read as timm's [sin, cos] (apply_rot_embed_cat)",
             stage=_rope_sin_cos_swapped, when=_rope),
    BugClass("rope_from_first_token", _ROPE, "the rotation applied from the first token: the class and register "
             "tokens turned, the last patches not", "timm's EvaAttention turns q[:, :, npt:] only (npt: the "
             "class and register tokens); the tables cover the patches", stage=_rope_from_first_token,
             when=lambda c: c.rope_type is not None and c.num_prefix_tokens > 0),
    BugClass("rope_frequencies_bfloat16", _ROPE, "the rotation's frequencies rounded to bfloat16: each angle, "
             "position x frequency, off by up to |angle| 2^-9", "keep inv_freq in float32: cast what the checkpoint "
             "holds (from_pretrained(dtype=...)), not the model's persistent=False buffers (model.to(dtype) rounds "
             "them), or compute the angles in float32", stage=_rope_frequencies_in("bfloat16"), when=_rope_fixed),
    BugClass("rope_temperature_10000", _ROPE, "the rotary base 10000 (EVA02's, timm's default)",
             "read the base from the checkpoint's config (timm's rope_temperature: 100 for the rope ViTs and DINOv3)",
             config={"rope_temperature": 10000.0}, when=_rope_banded),
    BugClass("rope_temperature_100", _ROPE, "the rotary base 100 (the rope ViTs' and DINOv3's)",
             "read the base from the checkpoint's config (timm's rope_temperature: 10000 for EVA02)",
             config={"rope_temperature": 100.0}, when=_rope_banded),
    BugClass("rope_rotate_half", _ROPE, "the rotation's pairs as halves (x_i, x_i+hd/2) where the model's are "
             "neighbours", _PAIRS_HINT, config={"rope_rotate_half": True}, when=_rope_banded),
    BugClass("rope_interleaved", _ROPE, "the rotation's pairs as neighbours where the model's are halves "
             "(x_i, x_i+hd/2)", _PAIRS_HINT, config={"rope_rotate_half": False}, when=_rope_banded),
    # relative position bias (timm's Beit)
    BugClass("rel_pos_index_transposed", _REL, "the relative position index transposed: key minus query, the "
             "class token's query and key rows exchanged", _INDEX_HINT, stage=_rel_pos_bias(np.transpose), when=_rel),
    BugClass("rel_pos_bias_one_head", _REL, "one head's column of the relative position table for every head",
             "the table is (rows, heads): table[index] -> (N, N, H), permuted to (H, N, N)",
             stage=_rel_pos_bias(lambda i: i, lambda table: np.repeat(table[:, :1], table.shape[1], 1)),
             when=lambda c: c.rel_pos_bias and c.num_heads > 1),
)
# fmt: on
