"""A clean step's costly products, followed by nearby runs (the noisy runs and local checks of a
full-size case): ``Tape``, and the magnitudes a contraction sums (``squares``)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
import numpy as np
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported

# ----------------------------------------------------------------------------- operations


def _scaled_rows(x):
    """x over a power of two per row (its largest entry in [1/2, 1)) as float32, and the exponents."""
    e = np.frexp(np.abs(x).max(axis=-1, keepdims=True))[1]
    return np.ldexp(x, -e).astype(np.float32), e


_LARGE = 1 << 22  # multiply-adds from which a product is worth float32's conversions (full-size models)
LARGE_ACTIVATION = 1 << 16  # elements from which an activation is taped (its clean slope held)


def is_large(x, w) -> bool:
    return x.size * w.shape[0] >= _LARGE


def times_t(x, w):
    """x wᵀ, for w 2-D: one matrix product over all of x's leading axes (a batched product of a
    stack of small ones is slower, and differs from it in the last bits)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])


def squares(x, w):
    """(x²) (w²)ᵀ, the magnitudes a contraction sums: in float32 on operands scaled by powers of
    two per row where the product is large (no square leaves float32's range; the product's own
    rounding, a few 1e-7 relative, is that of the bound, whose constants are calibrated to a tenth
    at best), in float64 where it is small."""
    if not is_large(x, w):
        return (x * x) @ (w * w).T
    (xs, ex), (ws, ew) = _scaled_rows(x), _scaled_rows(w)
    m2 = times_t(xs * xs, ws * ws)
    return np.ldexp(m2.astype(np.float64), 2 * (ex + np.swapaxes(ew, -1, -2)))


class Tape:
    """A clean step's costly operations in call order, for a run of the same stage from nearby
    inputs to follow (``following``): a noisy run (a value alone), a local check (the port's inputs,
    with its bound).

    ``calls``: (x, x wᵀ + b, m) per large contraction, m = √((x²)(w²)ᵀ + b²) the magnitudes its
    bound is made of; ``spreads``: (dx, √((dx²)(w²)ᵀ)) per input error carried through one
    (``propagate_linear``); ``acts``: (h, act(h), act'(h), |act(h)| + |h|) per activation. A run following the
    tape takes each contraction as the clean one plus (x − x₀) wᵀ, in float32 on the difference
    scaled by a power of two: what a noisy run measures is its difference from the clean run,
    which this computes to float32's rounding of the difference itself (a few 1e-6 of the
    deviation: the spread moves by as much), at half the cost of a float64 product. A bounded run
    takes the clean magnitudes plus what the difference can add to them (``nearby_bound``) where that
    is within ``NEARBY`` of them, and computes them afresh elsewhere; an activation, the clean one
    plus its slope times the difference where the curvature's share is below ``NEARBY`` of the
    rounding the bound allows there (``_activation_near``)."""

    KINDS = ("calls", "spreads", "acts")

    def __init__(self):
        self.calls: list[tuple] = []
        self.spreads: list[tuple] = []
        self.acts: list[tuple] = []

    @contextmanager
    def recording(self):
        _CURRENT.tape, _CURRENT.cursors = self, None
        try:
            yield self
        finally:
            _CURRENT.tape = None

    @contextmanager
    def following(self):
        _CURRENT.tape, _CURRENT.cursors = self, {k: iter(getattr(self, k)) for k in self.KINDS}
        try:
            yield self
        finally:
            _CURRENT.tape = _CURRENT.cursors = None


_CURRENT = threading.local()  # the tape this thread records or follows


def taped_step(kind: str) -> tuple[list | None, tuple | None]:
    """(the list to record in, None) in a clean step recording its tape; (None, the next entry of
    ``kind`` or None) in a run following one; (None, None) elsewhere."""
    tape = getattr(_CURRENT, "tape", None)
    if tape is None:
        return None, None
    if _CURRENT.cursors is None:
        return getattr(tape, kind), None
    return None, next(_CURRENT.cursors[kind], None)


# A bounded run following a tape keeps the clean magnitudes m₀ where what its input's difference d
# can add to them, ‖d‖ max|w| (Cauchy-Schwarz: |m − m₀| ≤ √((d²)(w²)ᵀ) ≤ that), is at most this
# share of them: the bound is then larger than the one from its own input by at most that share,
# and the float32 product of d (off by about u √K √((d²)(w²)ᵀ)) moves its value by at most that
# share of the bound's accumulation term. A float32 port's inputs are within 1e-5 of the oracle's;
# a chaotic case's deep stages are not, and are computed afresh.
NEARBY = 2.0**-5


def nearby_bound(m0, d, w):
    """m₀ + ‖d‖ max|w|, an upper bound of the magnitudes of x₀ + d, where within ``NEARBY`` of m₀
    everywhere; otherwise None."""
    reach = np.sqrt(np.einsum("...k,...k->...", d, d))[..., None] * np.abs(w).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if not (reach <= NEARBY * m0).all():
            return None
    return m0 + reach


def difference_product(d, w):
    """d wᵀ in float32, d scaled by one power of two (its largest entry's), returned in float64."""
    e = int(np.frexp(np.abs(d).max(initial=0.0))[1])
    return np.ldexp(times_t((d * 2.0**-e).astype(np.float32), np.asarray(w, np.float32)).astype(np.float64), e)
