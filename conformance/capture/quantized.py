"""Quantized weights read back as the numbers a kernel computes with (docs/quantization.md).

A quantized Linear stores each row's weights in groups: codes packed least significant bits
first into uint32 words, and per group a scale (and, in MLX's affine mode, a bias), so that a
weight is ``scale * grid[code] + bias``. This module decodes them in NumPy from each framework's
documented format, not through the framework's own dequantize (tests/test_quantized.py checks
that the two agree on every mode and width), and gives each weight its **half step**: half the
distance between the two grid points of its group around the float weight it was quantized
from (the distance to the grid's end beyond it). A correct quantizer leaves each weight within
its half step (and the dtype's rounding); the cost's error model draws noise of that size."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.numerics.precision import SMALLEST_NORMAL, UNIT_ROUNDOFF
from conformance.returned import Quantized
from conformance.support import Unsupported

# the quantization bugs ``QuantizedWeight.explain`` names (conformance.diagnosis.classes.OBSERVED)
BITS_ORDER_REVERSED = "quant_bits_order_reversed"
GROUP_SCALES_SHIFTED = "quant_group_scales_shifted"
ZERO_POINT_DROPPED = "quant_zero_point_dropped"

# FP4 E2M1 by code (OCP MX 1.0, table 5): sign bit 3, two exponent bits, one mantissa bit
FP4_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _fp8_e4m3() -> np.ndarray:
    import ml_dtypes

    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return values  # codes 0x7f and 0xff are NaN


@dataclass
class QuantizedWeight:
    """One module's weight as stored: ``value = scale * grid[codes] + bias``, each of ``scale``
    and ``bias`` expanded to the weight's shape (float64), ``grid`` the code values."""

    value: np.ndarray
    codes: np.ndarray
    grid: np.ndarray
    scale: np.ndarray
    bias: np.ndarray
    what: str  # "affine, 4 bits, groups of 64"
    bits: int = 8
    # the entries sharing one scale: consecutive runs of this many in the weight's C order (MLX's and
    # torchao's groups along a row, torch.ao's per-channel rows, its per-tensor whole)
    group_size: int = 1
    # the unit roundoff of the format the scales are stored in where the codes were chosen before
    # the scale was rounded to it (nvfp4's E4M3 scales: every grid point moves by up to 2^-4 of itself)
    scale_u: float = 0.0
    saturates: bool = False  # a float grid (MX, NV): a weight beyond its ends is clamped to them, however far
    input_levels: int | None = None  # its input quantized at run time per tensor to this many steps (torch.ao)
    # the smallest nonzero scale the format stores (nvfp4's E4M3 subnormal spacing times its global scale,
    # torch's observer's eps): a group of tiny weights may get it, whatever their spread
    scale_floor: float = 0.0
    ranged: bool = False  # MLX's affine grid: its scale from the group's range (min to max), not its largest |w|

    def format_scales(self, w: np.ndarray, dtype: str) -> np.ndarray:
        """The largest scale the format's documented quantizer gives each entry's group of float weights
        ``w`` (so the largest step of its grid): affine (MLX), the group's range over n = 2^bits - 1, times
        what shifting the grid to hold 0 may add: the scale becomes its end over a whole number k of
        steps, at least n // 2 where the end's quotient n/2 rounds down in the dtype, so 1 + 1/(2k)
        (measured: 1.2498 at 2 bits, 1.1667 at 3 in float16, 1.0714 at 4 in bfloat16); a symmetric
        or zero-pointed integer grid (torch.ao, torchao), twice the group's largest |w| over its
        2^bits - 1 steps (measured 2.0000001); a float grid (MX's
        power-of-two scale, NV's E4M3), the group's largest |w| over the grid's largest value, at most
        doubled by the scale's rounding up (measured 1.9999). Each times the dtype's rounding of the
        scale and the range, plus ``scale_floor``. A grid coarser than this cannot hold the float
        weights within the format's step: its half steps are taken at this scale. Computed once per
        weight (``canonical``) and handed to the methods that read it as ``limit``."""
        g = self.group_size
        w = np.asarray(w, np.float64).reshape(-1, g)
        u = UNIT_ROUNDOFF[dtype]
        if self.saturates:
            top = np.abs(self.grid[np.isfinite(self.grid)]).max()
            per = 2 * np.abs(w).max(-1) / top
        elif self.ranged:
            levels = 2**self.bits - 1
            per = (w.max(-1) - w.min(-1)) / levels * (1 + 1 / (2 * max(1, levels // 2)))
        else:
            per = 2 * np.abs(w).max(-1) / (len(self.grid) - 1)
        per = per * (1 + 4 * u) + self.scale_floor + SMALLEST_NORMAL[dtype]
        return np.repeat(per, g).reshape(self.codes.shape)

    def coarseness(self, limit: np.ndarray) -> float:
        """The largest ratio of a group's scale to its ``format_scales`` (``limit``): above 1, a grid too coarse."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.max(np.abs(self.scale) / limit, initial=0.0))

    @property
    def reach(self) -> np.ndarray:
        """|scale · grid value| + |bias|: what a weight's dequantization rounds in (it may cancel)."""
        return np.abs(self.scale * self.grid[self.codes]) + np.abs(self.bias)

    def half_steps(self, w: np.ndarray, limit: np.ndarray) -> np.ndarray:
        """Half the grid's spacing around each float weight ``w`` (in the model's layout), in
        weight units, the grid's scale taken as at most ``limit`` (``format_scales``)."""
        return _half_steps(w, self.grid, self.scale, self.bias, self.scale_u, self.saturates, limit)

    def fits(self, w: np.ndarray, dtype: str, value=None, scale=None, bias=None, half=None, limit=None) -> bool:
        """Whether every weight (``value``, read with ``scale`` and ``bias``: by default as stored)
        lies within its half step (``half``, where known) and the dtype's ``slack`` of its float
        weight ``w``."""
        value, scale, bias = (
            (self.value if value is None else value),
            (self.scale if scale is None else scale),
            (self.bias if bias is None else bias),
        )
        reach = np.abs(value - bias) + np.abs(bias)
        if half is None:
            limit = self.format_scales(w, dtype) if limit is None else limit
            half = _half_steps(w, self.grid, scale, bias, self.scale_u, self.saturates, limit)
        return bool(np.all(np.abs(value - w) <= half + slack(w, reach, dtype)))

    def explain(self, w: np.ndarray, dtype: str, half=None, limit=None) -> str | None:
        """The quantization bug that makes the stored weight what it is, where decoding it back
        the bug's way puts every weight within its half step of ``w`` (and the plain decoding does
        not): codes packed most significant first, each group read with its neighbour's scale and
        bias, or each group off by one constant (its zero point, the bias, dropped). ``half`` and
        ``limit``: the weights' ``half_steps`` and ``format_scales``, where already known."""
        w = np.asarray(w, np.float64)
        limit = self.format_scales(w, dtype) if limit is None else limit
        half = self.half_steps(w, limit) if half is None else half
        if self.fits(w, dtype, half=half):
            return None
        per = 32 // self.bits if 32 % self.bits == 0 else 0
        if per > 1:  # the same scales and biases: the same half steps
            codes = self.codes.reshape(*self.codes.shape[:-1], -1, per)[..., ::-1].reshape(self.codes.shape)
            if self.fits(w, dtype, self.scale * self.grid[codes] + self.bias, half=half):
                return BITS_ORDER_REVERSED
        g = self.group_size
        for shift in (g, -g):
            scale, bias = np.roll(self.scale, shift, -1), np.roll(self.bias, shift, -1)
            if self.fits(w, dtype, scale * self.grid[self.codes] + bias, scale, bias, limit=limit):
                return GROUP_SCALES_SHIFTED
        # a dropped bias leaves each group off by one constant (its midrange), each weight then within a
        # step of it (a correct affine grid clamps its group's far end by up to a step, ``_half_steps``)
        if g < 2:  # a constant per weight fits any move: a class that fits everything names nothing
            return None
        gap = (w - self.value).reshape(-1, g)
        offset = np.repeat((gap.max(-1) + gap.min(-1)) / 2, g).reshape(w.shape)
        residual = np.abs(self.value + offset - w)
        if np.all(residual <= np.abs(self.scale) + slack(w, np.abs(self.value) + np.abs(offset), dtype)):
            return ZERO_POINT_DROPPED if np.any(np.abs(offset) > np.abs(self.scale)) else None
        return None


def _half_steps(w, grid, scale, bias, scale_u: float = 0.0, saturates: bool = False, limit=None) -> np.ndarray:
    """Half the spacing of ``scale * grid + bias`` around each ``w`` (``scale`` taken as at most
    ``limit``, the format's documented scale: a coarser grid is the quantizer's finding); beyond the grid's ends the
    distance to the end: a float grid saturates (MX's power-of-two scale puts a group's largest |w|
    below 8 where E2M1 ends at 6; nvfp4's E4M3 scale, subnormal for a group of small weights, may
    put it far beyond), and MLX's affine grid, shifted to hold 0 exactly, clamps its group's far
    end by up to a step (measured: 0.90 of a step), so an affine grid allows a step at most."""
    grid = np.unique(grid[np.isfinite(grid)])
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(scale != 0, (np.asarray(w, np.float64) - bias) / scale, 0.0)
    i = np.clip(np.searchsorted(grid, v), 1, len(grid) - 1)
    inside = (grid[i] - grid[i - 1]) / 2
    beyond = np.where(v < grid[0], grid[0] - v, v - grid[-1])
    outside = beyond if saturates else np.minimum(beyond, np.where(v < grid[0], grid[1] - grid[0], grid[-1] - grid[-2]))
    spacing = np.abs(scale) if limit is None else np.minimum(np.abs(scale), limit)
    half = np.where((v >= grid[0]) & (v <= grid[-1]), inside, outside) * spacing
    return half + scale_u * np.abs(np.asarray(w, np.float64) - bias)


def slack(w: np.ndarray, reach: np.ndarray, dtype: str) -> np.ndarray:
    """What a correct quantization in ``dtype`` may add to a weight's half step: the float weight's
    own rounding to the dtype (half a subnormal spacing, ``u`` times the smallest normal, below it),
    and the grid point moved by the rounding of its group's scale and bias (``reach``), twice: the
    code was chosen from the rounded scale."""
    u = UNIT_ROUNDOFF[dtype]
    return u * (np.abs(w) + 2 * reach + SMALLEST_NORMAL[dtype])


def unpack(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """``n`` unsigned ``bits``-wide codes per row from a row of uint32 words, read as one stream of
    bits, least significant first (MLX's packing for every width, 3, 5 and 6 bits across words)."""
    stream = np.unpackbits(np.ascontiguousarray(words.astype("<u4")).view(np.uint8), axis=-1, bitorder="little")
    fields = stream[..., : n * bits].reshape(*words.shape[:-1], n, bits).astype(np.int64)
    return (fields << np.arange(bits)).sum(-1)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """``unpack``'s inverse: rows of ``bits``-wide codes as uint32 words, least significant first."""
    codes = np.asarray(codes, np.int64)
    fields = ((codes[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(*codes.shape[:-1], -1)
    return np.packbits(fields, axis=-1, bitorder="little").view("<u4").astype(np.uint32)


def _expand(per_group: np.ndarray, group_size: int) -> np.ndarray:
    return np.repeat(np.asarray(per_group, np.float64), group_size, axis=-1)


def mlx_weight(weight, scales, biases, group_size: int, bits: int, mode: str, global_scale=None) -> QuantizedWeight:
    """An MLX QuantizedLinear's weight (mx.quantize's format), decoded; arrays as NumPy (scales
    in float32 or uint8 as stored)."""
    words = np.asarray(weight)
    if words.dtype != np.uint32:
        raise ValueError(f"a quantized weight is packed in uint32 words, got {words.dtype}")
    n = words.shape[-1] * 32 // bits
    codes = unpack(words, bits, n)
    if mode == "affine":
        grid = np.arange(2**bits, dtype=np.float64)
        scale, bias, floor = _expand(scales, group_size), _expand(biases, group_size), 0.0
    elif mode in ("mxfp4", "mxfp8", "nvfp4"):
        grid = FP4_E2M1 if bits == 4 else _fp8_e4m3()
        raw = np.asarray(scales)
        if mode.startswith("mx"):  # E8M0: a power of two, biased by 127
            per_group = np.exp2(raw.astype(np.float64) - 127)
        else:  # E4M3
            import ml_dtypes

            per_group = raw.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        times = 1.0 if global_scale is None else float(np.asarray(global_scale, np.float64).reshape(-1)[0])
        per_group, floor = per_group * times, (2.0**-9 * abs(times) if mode == "nvfp4" else 0.0)  # E4M3's subnormal
        scale, bias = _expand(per_group, group_size), np.zeros(codes.shape)
    else:
        raise ValueError(f"quantization mode {mode!r} is not one this tool decodes (affine, mxfp4, mxfp8, nvfp4)")
    value = scale * grid[codes] + bias
    what = f"{mode}, {bits} bits, groups of {group_size}"
    return QuantizedWeight(
        value, codes, grid, scale, bias, what, bits, group_size, 2.0**-4 if mode == "nvfp4" else 0.0,
        saturates=mode != "affine", scale_floor=floor, ranged=mode == "affine",
    )  # fmt: skip


def torch_weight(qweight) -> QuantizedWeight:
    """A PyTorch quantized tensor (torch.ao's per-tensor or per-channel affine qint8/quint8), decoded
    from its integer representation, scales and zero points: ``scale * (code - zero_point)``."""
    import torch

    codes = qweight.int_repr().numpy().astype(np.int64)
    shape = codes.shape
    if qweight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scale = np.full(shape, float(qweight.q_scale()))
        zero = np.full(shape, float(qweight.q_zero_point()))
        how, group = "per tensor", codes.size
    else:
        axis = qweight.q_per_channel_axis()
        if axis != 0:
            raise Unsupported(f"a weight quantized per channel along axis {axis} is not read yet: along axis 0 is")
        group = codes.size // max(shape[0], 1)
        along = [1] * len(shape)
        along[axis] = shape[axis]
        scale = np.broadcast_to(qweight.q_per_channel_scales().double().numpy().reshape(along), shape)
        zero = np.broadcast_to(qweight.q_per_channel_zero_points().double().numpy().reshape(along), shape)
        how = "per channel"
    info = np.iinfo({torch.qint8: np.int8, torch.quint8: np.uint8}[qweight.dtype])
    grid = np.arange(info.min, info.max + 1, dtype=np.float64)
    value = scale * (codes - zero)
    what = f"{str(qweight.dtype)[6:]}, {how}"
    # torch's observers clamp a scale to float32's eps (torch.ao.quantization.observer)
    eps = float(np.finfo(np.float32).eps)
    return QuantizedWeight(value, codes - info.min, grid, scale, -scale * zero, what, 8, group, scale_floor=eps)


def canonical(read: dict[str, QuantizedWeight], where: dict, state, arrays, dtype: str) -> Quantized:
    """The model's quantized weights (model key -> QuantizedWeight) brought back to the canonical
    keys through the mapping's entry map (``ModelPort.entry_map``: canonical key -> [(model key,
    each entry's canonical flat index)]); ``arrays``: the float weights the model was loaded with,
    in its layouts (each weight's half step is taken around its float value); ``dtype``: what it
    was quantized in."""
    values, steps, reach, named, levels, coarse = {}, {}, {}, {}, {}, {}
    for key, targets in where.items():
        hit = [(mk, index) for mk, index in targets if mk in read]
        if not hit:
            continue
        value = np.array(state[key], np.float64).ravel()
        step, far = np.zeros(value.size), np.abs(value)
        for mk, index in hit:
            limit = read[mk].format_scales(arrays[mk], dtype)  # once: every step below reads it
            half = read[mk].half_steps(arrays[mk], limit)  # once: the plain decoding's fit reads it too
            name = read[mk].explain(arrays[mk], dtype, half, limit)
            if name:
                named[key] = name
            ratio = read[mk].coarseness(limit)
            if ratio > 1:
                coarse[key] = max(ratio, coarse.get(key, 0.0))
            if read[mk].input_levels:
                levels[key] = read[mk].input_levels
            taken = index >= 0
            value[index[taken]] = read[mk].value.ravel()[taken]
            step[index[taken]] = half.ravel()[taken]
            far[index[taken]] = read[mk].reach.ravel()[taken]
        shape = np.shape(state[key])
        values[key], steps[key], reach[key] = value.reshape(shape), step.reshape(shape), far.reshape(shape)
    kinds = sorted({q.what for q in read.values()})
    what = f"{len(read)} weight(s) quantized: {'; '.join(kinds)}"
    return Quantized(values, steps, reach, what, named, levels, coarse)


def torchao_weight(weight, path: str) -> QuantizedWeight:
    """torchao's int8 weight-only tensor (``quantize_(model, Int8WeightOnlyConfig())``: an
    ``Int8Tensor`` with int8 ``qdata``, a ``scale`` per block of ``block_size``, and a zero point
    if it has one), decoded: ``scale * (code - zero_point)``. One that also quantizes its input at
    run time (``act_quant_kwargs``) is not read yet."""

    if getattr(weight, "act_quant_kwargs", None) is not None or str(weight.qdata.dtype) != "torch.int8":
        raise Unsupported(
            f"{path}'s weight ({type(weight).__name__}, {weight.qdata.dtype}, its input quantized too: "
            f"{getattr(weight, 'act_quant_kwargs', None) is not None}) is not read yet: torchao's int8 weight-only is "
            "(docs/quantization.md)"
        )
    codes = weight.qdata.detach().numpy().astype(np.int64)
    block = [int(b) for b in weight.block_size]
    if any(b != 1 for b in block[:-1]):
        raise Unsupported(f"{path}'s weight is quantized in blocks of {block}: blocks along a row (1, ..., n) are read")

    def expanded(t):
        t = np.asarray(t.detach().double().numpy())
        for axis, size in enumerate(block):
            t = np.repeat(t, size, axis=axis) if t.shape[axis] != codes.shape[axis] else t
        return np.broadcast_to(t, codes.shape)

    scale = expanded(weight.scale)
    zero = getattr(weight, "zero_point", None)
    zero = np.zeros(codes.shape) if zero is None else expanded(zero)
    grid = np.arange(-128, 128, dtype=np.float64)
    what = f"torchao int8 weight-only, blocks of {'x'.join(map(str, block))}"
    return QuantizedWeight(scale * (codes - zero), codes + 128, grid, scale, -scale * zero, what, 8, block[-1])
