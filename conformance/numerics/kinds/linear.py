"""The error model of a contraction (a Linear, the patch conv): its float64 value and unit bound."""

from __future__ import annotations

import math
import numpy as np
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from conformance.numerics.roundings import Precision
from conformance.numerics.runs import beside
from conformance.numerics.tape import difference_product, is_large, nearby_bound, taped_step, times_t, squares


def linear(x, w, b, p: Precision):
    """y = x wᵀ + b and its unit bound; w is (out, in)."""
    # a small product is not taped: its float64 costs less than the difference
    record, entry = taped_step("calls") if is_large(x, w) else (None, None)
    if entry is not None and entry[0].shape == x.shape:  # a run following the clean step's tape
        x0, y0, m0 = entry
        d = x - x0
        m = None if not p.bounds or m0 is None else nearby_bound(m0, d, w)
        if not p.bounds or m is not None:
            y = y0 + difference_product(d, w)
            if np.isfinite(y).all():
                return (
                    (y, 0.0) if not p.bounds else (y, _linear_bound(x.shape[-1], m, y, p) + _quantized_input(x, w, p))
                )
    # the clean step's magnitudes beside its value: the step is what the other runs wait for
    magnitudes = beside().submit(squares, x, w) if record is not None and p.bounds else None
    y = times_t(x, w) if is_large(x, w) else x @ w.T
    if b is not None:
        y = y + b
    if not p.bounds:
        if record is not None:
            record.append((x, y, None))
        return y, 0.0
    m2 = squares(x, w) if magnitudes is None else magnitudes.result()
    if b is not None:
        m2 = m2 + b * b
    m = np.sqrt(m2)
    if record is not None:
        record.append((x, y, m))
    return y, _linear_bound(x.shape[-1], m, y, p) + _quantized_input(x, w, p)


def _quantized_input(x, w, p: Precision):
    """A dynamically quantized input's error (torch.ao's int8 Linear): each element of x moves by
    up to half its step Δ = range(x ∪ 0) / levels, and the grid's zero point, rounded to an
    integer, may clip an end by another half; independent signs: Δ ‖w_j‖ for output j."""
    if not p.input_levels:
        return 0.0
    delta = (max(float(np.max(x)), 0.0) - min(float(np.min(x)), 0.0)) / p.input_levels
    return delta * np.sqrt(np.sum(np.square(w), axis=-1))


def _linear_bound(K: int, m, y, p: Precision):
    return p.compute * math.sqrt(K) * m + p.storage * m + p.output * np.abs(y)


def propagate_linear(dx, w):
    """How an input error dx (independent signs) moves x wᵀ."""
    record, entry = taped_step("spreads") if is_large(dx, w) else (None, None)
    if entry is not None and entry[0].shape == dx.shape:  # a bounded run following the clean step's tape
        m = nearby_bound(entry[1], dx - entry[0], w)
        if m is not None:
            return m
    m = np.sqrt(squares(dx, w))
    if record is not None:
        record.append((dx, m))
    return m
