"""NaFlex's packed batches: images on different patch grids, each cut into patches, laid one
sequence per row and padded to one length, with each patch's (row, column) and whether it is an
image's or padding (timm's NaFlexVit: ``patches``, ``patch_coord``, ``patch_valid``; SigLIP 2:
``pixel_values``, ``pixel_attention_mask``, ``spatial_shapes``).

The reference is each image alone, on its own grid: a model that keeps padding out of every
image's attention and pooling computes on each row what it computes on that image by itself, so
each row of the port's taps, its padding cut off, is compared with the float64 oracle on its
image (a ``CaseModel`` of one image, ``dynamic_img_size``). Padding is neither compared nor
allowed to matter: a port that lets a row attend its padding, pools it, or resizes the table to
the padded grid differs on the row's own tokens.

A row holds its patches first, row-major over its grid (timm's ``batch_patchify``, each patch
flattened (ph, pw, C)), then padding; its prefix tokens come before its patches in every tap.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.generators import IMAGE_KINDS, OFFSET, TrainedLike, WeightCase, make_images
from conformance.sandbox.portable import packed_shape  # noqa: F401 - the sandbox's, re-exported
from conformance.verify.cases import Case
from impls.protocol import ViTConfig, packed_rows
from impls.stages import stage_of, tap_symbols

PADDING = 3  # padding patches after the longest row too: every row has some


def patchify(image: np.ndarray, patch_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(C, H, W) -> its patches (n, ph pw C), row-major over the grid, and their (row, column)."""
    C, H, W = image.shape
    (ph, pw) = patch_size
    gh, gw = H // ph, W // pw
    patches = image.reshape(C, gh, ph, gw, pw).transpose(1, 3, 2, 4, 0).reshape(gh * gw, ph * pw * C)
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    return patches, np.stack([rows, cols], axis=1)


def unpatchify(patches: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int]) -> np.ndarray:
    """patchify's inverse: (gh gw, ph pw C) -> (C, gh ph, gw pw)."""
    (gh, gw), (ph, pw) = grid, patch_size
    C = patches.shape[1] // (ph * pw)
    return patches.reshape(gh, gw, ph, pw, C).transpose(4, 0, 2, 1, 3).reshape(C, gh * ph, gw * pw)


def pack(images: list[np.ndarray], patch_size: tuple[int, int], padding: int = PADDING):
    """Images (each (C, H, W), its own size) -> (patches (B, L, ph pw C) float32, patch_coord
    (B, L, 2) int64, patch_valid (B, L) bool), L the longest row's patches plus ``padding``;
    padding patches are zeros at coordinate (0, 0)."""
    rows = [patchify(np.asarray(im, np.float32), patch_size) for im in images]
    length = max(len(p) for p, _ in rows) + padding
    patches = np.zeros((len(rows), length, rows[0][0].shape[1]), np.float32)
    coord = np.zeros((len(rows), length, 2), np.int64)
    valid = np.zeros((len(rows), length), bool)
    for i, (p, c) in enumerate(rows):
        patches[i, : len(p)], coord[i, : len(p)], valid[i, : len(p)] = p, c, True
    return patches, coord, valid


def rows_of(case, patch_size: tuple[int, int]) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """A packed case's images, each (1, C, H, W), and its grid, from its patches (lossless)."""
    rows = packed_rows(case.patch_coord, case.patch_valid)
    return [(unpatchify(p[:n], grid, patch_size)[None], grid) for p, (n, grid) in zip(case.images, rows)]


def unpack(out: Mapping, i: int, patches: int, config: ViTConfig) -> dict[str, np.ndarray]:
    """Row ``i`` of every tap, its padding cut off: the taps of that image alone, batch 1."""
    sizes = tap_symbols(config, 1, patches)  # the image's own: its token axes cut to its patches
    own = {}
    for name, value in out.items():
        axes = stage_of(name)[0].shape.split()
        own[name] = np.asarray(value)[(slice(i, i + 1),) + tuple(slice(sizes[s]) for s in axes[1:])]
    return own


def nonfinite_outside(name: str, value, rows, config: ViTConfig) -> str | None:
    """Where tap ``name`` of a packed batch holds NaN or Inf outside what the rows' comparison reads
    (a row's padding, a token axis past its image's tokens), in words, or None: a non-finite value
    anywhere the port emits is a finding (downstream, 0 * NaN is NaN: a mask does not clean it)."""
    a = np.asarray(value)
    if not np.issubdtype(a.dtype, np.floating) or np.isfinite(a).all():
        return None
    axes = stage_of(name)[0].shape.split()
    bad = ~np.isfinite(a)
    for i, (_, (gh, gw)) in enumerate(rows):  # what each row's comparison reads is told there
        sizes = tap_symbols(config, 1, gh * gw)
        bad[(slice(i, i + 1),) + tuple(slice(sizes[s]) for s in axes[1:])] = False
    if not bad.any():
        return None
    at = np.argwhere(bad)
    first = ", ".join(f"{axis} {int(j)}" for axis, j in zip(axes, at[0]))
    return (
        f"{int(bad.sum())} non-finite value(s) ({int(np.isnan(a[bad]).sum())} NaN) outside the images' own tokens "
        f"(their padding), in {len(set(at[:, 0].tolist()))} row(s); the first at {first}: a non-finite value "
        "anywhere the port emits is a finding (a mask multiplies NaN into NaN)"
    )


class PackedModel:
    """A packed case's reference: the oracle on each of its images alone (the loop's ``Reference``)."""

    def __init__(self, config: ViTConfig, case, dtype: str):
        from conformance.numerics.error_model import CaseModel

        self.rows = rows_of(case, config.patch_size)
        self.shape = case.images.shape[:2]  # (rows, patches a row, padding included)
        self.models = [CaseModel(config, case.state, images, dtype, stream=True) for images, _ in self.rows]

    def beyond_range(self) -> str | None:
        return next((why for why in (m.beyond_range() for m in self.models) if why), None)

    def settle(self) -> None:
        for m in self.models:
            m.settle()


def packed_plan(config: ViTConfig, state: dict | None = None, seed: int = 0):
    """(name, make the case) for a port that takes packed batches: verify's image kinds on the
    given (or seeded) weights, and with seeded weights its scaled, offset and trained-like ones,
    each a batch of three images on three grids of their own (the config's, one row more and a
    column less, one row less and two columns more), padded."""

    gh, gw = config.grid_size
    grids = (config.grid_size, (gh + 1, max(1, gw - 1)), (max(1, gh - 1), gw + 2))
    shown = ", ".join(f"{a}x{b}" for a, b in grids)
    memo: dict[str, dict] = {}

    def base() -> dict:
        if "base" not in memo:
            memo["base"] = dict(state) if state is not None else WeightCase(seed, 1.0).make(config)
        return memo["base"]

    def case(label: str, kind: str, image_seed: int, weights=None):
        name = f"{label} (batch 3, packed: grids {shown})"

        def make():
            images = [make_images(config, 1, kind, image_seed + j, grid)[0] for j, grid in enumerate(grids)]
            patches, coord, valid = pack(images, config.patch_size)
            weights_ = base() if weights is None else weights.make(config)
            return Case(name, patches, weights_, patch_coord=coord, patch_valid=valid)

        make.uses_base, make.memo = weights is None, memo
        return name, make

    plan = [case(f"{kind} images", kind, seed + 10 * i) for i, kind in enumerate(IMAGE_KINDS)]
    if state is None:
        weights = (
            (WeightCase(seed + 1, 4.0), "weights x4"),
            (WeightCase(seed + 2, 4.0, OFFSET), "offset 1000"),
            (WeightCase(seed + 3, 64.0), "weights x64"),
            (TrainedLike(seed + 4), "trained-like weights"),
        )
        plan += [case(f"ordinary images, {label}", "ordinary", seed, w) for w, label in weights]
    return plan
