"""The error model: for every stage, how far a correct port's rounding can move each element.

Each stage is evaluated in float64 from its **inputs** (by default the port's own taps, so a
stage is judged on the one operation it performs and errors do not compound across blocks),
together with a per-element **unit bound**: the rounding a correct implementation commits
there, built from the computation at hand,

* a contraction of length K over magnitudes a_k b_k (a Linear, the patch conv, q·k, P·v):
  ``u_c √K √(Σ a_k² b_k²) + u_s (|y| + √(Σ a_k² b_k²))`` (accumulation in the compute
  precision, inputs, weights and output rounded to the storage precision);
* a LayerNorm of a token with mean μ, spread σ and rms = √(μ² + σ²):
  ``u_c √D |γ| (rms/σ + |x̂|) + u_s (|y| + |γ x̂| + |β|)``: the mean and variance lose
  u·rms, which the normalisation divides by σ, so a token whose mean is large against its
  spread (trained ViTs' high-norm tokens) is ill-conditioned, and the bound says so;
* a softmax over logits l with row maximum m: each logit may be off by
  ``E = u_c (√hd A + |l − m| + 1) + u_s (|l| + A)`` (A = scale √(q² · k²) the magnitude of
  the logit's sum), which moves its weight by a factor up to exp(E) and the normaliser by
  up to exp(Ē), Ē = log Σ P exp(E): bound ``P expm1(E + Ē)`` (``P (E + Σ P E)`` to first
  order, at most 1); large logits loosen it, as they must;
* GELU: ``|gelu'(h)|`` times the bound of its input, plus ``u_s (|a| + |h|)``;
* a sum (residual, position embedding): ``u_s (|a| + |b|)``.

``u_s`` is the unit roundoff of the port's dtype and ``u_c`` that of float32 (what every
framework accumulates and keeps LayerNorm and softmax statistics in for bf16/fp16).

A stage's **ratio** is ``max_i |port_i − oracle_i| / unit_bound_i``; tolerances.py holds the
largest ratio calibrated on correct ports per stage kind and dtype, times a margin.

A stage whose inputs the port does not emit (a port that returns only logits) is judged end
to end: the bound then **propagates**, estimated by running the whole chain in float64 with
each stage perturbed by Gaussian noise of its unit bound (``noisy_runs`` draws); the stage's
end-to-end ratio is ``max|port − oracle| / max|noisy − oracle|``.

The clean run and the noisy runs go in step, a stage at a time (``_Runs``): a small model's
are held for every port that reads them; a full-size case's (``stream=True``) are computed as
the comparison reads them in model order and let go, in threads (``pool``), so that what a
case holds is a block's stages, not the model's. There the noisy runs and the local checks
follow the clean step's large contractions and activations (``Tape``): a local bound is then at
most ``NEARBY`` (1/32) looser than one computed afresh from the port's inputs, and is computed
afresh wherever it would be looser.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager, nullcontext
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy.special import erf

from conformance.numerics.mapped import let_go
from conformance.numerics.precision import DTYPES, LARGEST, SMALLEST_NORMAL, UNIT_ROUNDOFF, coarsest
from impls import numpy_vit as O
from impls.stages import CONTRACTIONS, stage_inputs, stage_kind  # noqa: F401 - re-exported
from impls.protocol import ViTConfig, tap_names, tap_shapes
from weights.resample import bicubic_aa_matrix


@dataclass(frozen=True)
class Precision:
    """The roundings a stage commits: ``dtype`` its operands and weights are stored in,
    ``output_dtype`` its output (mixed precision: a stage emitted in float32 when the port runs
    in bfloat16), ``input_dtype`` its input taps' (a port may hold a summand more precisely than
    its tap shows); both default to ``dtype``, as in a port that computes in one dtype."""

    dtype: str = "float32"
    output_dtype: str | None = None
    input_dtype: str | None = None
    bounds: bool = True  # False: the values alone, every bound 0 (a noisy run's: it is perturbed by the clean run's)

    def __post_init__(self):
        for d in (self.dtype, self.output_dtype or self.dtype, self.input_dtype or self.dtype):
            if d not in UNIT_ROUNDOFF:
                raise ValueError(f"dtype must be one of {DTYPES}, got {d!r}")

    @property
    def storage(self) -> float:
        return UNIT_ROUNDOFF[self.dtype]

    @property
    def output(self) -> float:
        return UNIT_ROUNDOFF[self.output_dtype or self.dtype]

    @property
    def inputs(self) -> float:
        return UNIT_ROUNDOFF[self.input_dtype or self.dtype]

    @property
    def compute(self) -> float:
        return UNIT_ROUNDOFF["float64" if self.dtype == "float64" else "float32"]

    @property
    def tiny(self) -> float:
        """Below this a weight may flush to zero (XLA and fp16 flush subnormals)."""
        return SMALLEST_NORMAL[self.dtype]


# ----------------------------------------------------------------------------- operations


def _scaled_rows(x):
    """x over a power of two per row (its largest entry in [1/2, 1)) as float32, and the exponents."""
    e = np.frexp(np.abs(x).max(axis=-1, keepdims=True))[1]
    return np.ldexp(x, -e).astype(np.float32), e


_LARGE = 1 << 22  # multiply-adds from which a product is worth float32's conversions (full-size models)
_LARGE_ACTIVATION = 1 << 16  # elements from which an activation is taped (its clean slope held)


def _large(x, w) -> bool:
    return x.size * w.shape[0] >= _LARGE


def _times_t(x, w):
    """x wᵀ, for w 2-D: one matrix product over all of x's leading axes (a batched product of a
    stack of small ones is slower, and differs from it in the last bits)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])


def squares(x, w):
    """(x²) (w²)ᵀ, the magnitudes a contraction sums: in float32 on operands scaled by powers of
    two per row where the product is large (no square leaves float32's range; the product's own
    rounding, a few 1e-7 relative, is that of the bound, whose constants are calibrated to a tenth
    at best), in float64 where it is small."""
    if not _large(x, w):
        return (x * x) @ (w * w).T
    (xs, ex), (ws, ew) = _scaled_rows(x), _scaled_rows(w)
    m2 = _times_t(xs * xs, ws * ws)
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
    takes the clean magnitudes plus what the difference can add to them (``_nearby``) where that
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


def _taped(kind: str) -> tuple[list | None, tuple | None]:
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


def _nearby(m0, d, w):
    """m₀ + ‖d‖ max|w|, an upper bound of the magnitudes of x₀ + d, where within ``NEARBY`` of m₀
    everywhere; otherwise None."""
    reach = np.sqrt(np.einsum("...k,...k->...", d, d))[..., None] * np.abs(w).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if not (reach <= NEARBY * m0).all():
            return None
    return m0 + reach


def _difference_product(d, w):
    """d wᵀ in float32, d scaled by one power of two (its largest entry's), returned in float64."""
    e = int(np.frexp(np.abs(d).max(initial=0.0))[1])
    return np.ldexp(_times_t((d * 2.0**-e).astype(np.float32), np.asarray(w, np.float32)).astype(np.float64), e)


def linear(x, w, b, p: Precision):
    """y = x wᵀ + b and its unit bound; w is (out, in)."""
    # a small product is not taped: its float64 costs less than the difference
    record, entry = _taped("calls") if _large(x, w) else (None, None)
    if entry is not None and entry[0].shape == x.shape:  # a run following the clean step's tape
        x0, y0, m0 = entry
        d = x - x0
        m = None if not p.bounds or m0 is None else _nearby(m0, d, w)
        if not p.bounds or m is not None:
            y = y0 + _difference_product(d, w)
            if np.isfinite(y).all():
                return (y, 0.0) if not p.bounds else (y, _linear_bound(x.shape[-1], m, y, p))
    # the clean step's magnitudes beside its value: the step is what the other runs wait for
    magnitudes = beside().submit(squares, x, w) if record is not None and p.bounds else None
    y = _times_t(x, w) if _large(x, w) else x @ w.T
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
    return y, _linear_bound(x.shape[-1], m, y, p)


def _linear_bound(K: int, m, y, p: Precision):
    return p.compute * math.sqrt(K) * m + p.storage * m + p.output * np.abs(y)


def propagate_linear(dx, w):
    """How an input error dx (independent signs) moves x wᵀ."""
    record, entry = _taped("spreads") if _large(dx, w) else (None, None)
    if entry is not None and entry[0].shape == dx.shape:  # a bounded run following the clean step's tape
        m = _nearby(entry[1], dx - entry[0], w)
        if m is not None:
            return m
    m = np.sqrt(squares(dx, w))
    if record is not None:
        record.append((dx, m))
    return m


def layer_norm(x, weight, bias, eps, p: Precision, dx=None):
    D = x.shape[-1]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    sigma = np.sqrt(var + eps)
    xh = (x - mu) / sigma
    y = xh * weight + bias
    if not p.bounds:
        return y, 0.0
    rms = np.sqrt(mu * mu + var)
    g = np.abs(weight)
    bound = (
        p.compute * math.sqrt(D) * g * (rms / sigma + np.abs(xh))
        + p.storage * (g * np.abs(xh) + np.abs(bias))
        + p.output * np.abs(y)
    )
    # The input may be held more precisely than its tap shows (XLA keeps bf16 sums in float32
    # until they are stored), or is a sum the port does not tap: one rounding of it either way.
    dx = p.inputs * np.abs(x) if dx is None else dx
    bound = bound + g / sigma * (dx + np.sqrt((dx * dx).mean(-1, keepdims=True)))
    return y, bound


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def activation(name: str, h, slope: bool = True):
    """(act(h), act'(h)) in float64 for timm's act_layer ``name`` (``slope=False``: (act(h), None))."""
    if name == "gelu":
        cdf = 0.5 * (1.0 + erf(h / math.sqrt(2.0)))
        return h * cdf, (cdf + h * np.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)) if slope else None
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (h + 0.044715 * h**3))
        d = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * h * h) if slope else None
        return 0.5 * h * (1.0 + t), d
    k = 1.702 if name == "quick_gelu" else 1.0  # silu: x sigmoid(x)
    sg = _sigmoid(k * h)
    return h * sg, (sg + k * h * sg * (1.0 - sg)) if slope else None


# |act''| <= this for every activation above (gelu's is 2 phi(0) = 0.80, quick_gelu's 0.85 at 0)
CURVATURE = 1.0


def _activation_near(name: str, h, entry, p: Precision):
    """(act(h), an upper bound of |act'(h)|) from a clean step's (h₀, act(h₀), act'(h₀), |act(h₀)|
    + |h₀|): where h is near h₀, the clean value plus its slope times d = h − h₀ (off by at most
    CURVATURE d²/2, kept below ``NEARBY`` of the rounding u_s (|a| + |h|) the bound allows there)
    and |act'(h₀)| + CURVATURE |d|; elsewhere act itself."""
    h0, a0, s0, size = entry
    d = np.subtract(h, h0)
    far = d * d > (2 * NEARBY * p.storage / CURVATURE) * size
    a = np.multiply(s0, d)
    a += a0
    slope = None
    if p.bounds:
        slope = np.abs(d, out=d)
        slope *= CURVATURE
        slope += np.abs(s0)
    if far.any():
        exact, exact_slope = activation(name, h[far], p.bounds)
        a[far] = exact
        if p.bounds:
            slope[far] = np.abs(exact_slope)
    return a, slope


def gelu(h, dh, p: Precision, name: str = "gelu"):
    """An activation of h (off by dh): its slope carries dh; the function itself is evaluated in
    the storage dtype by some frameworks (MLX's erf): absolute error u_s (|a| + |h|)."""
    record, entry = _taped("acts") if h.size >= _LARGE_ACTIVATION else (None, None)
    if entry is not None and entry[0].shape == h.shape:  # a run following the clean step's tape
        a, slope = _activation_near(name, h, entry, p)
    else:
        a, slope = activation(name, h, p.bounds or record is not None)
        if record is not None:
            record.append((h, a, slope, np.abs(a) + np.abs(h)))
    if not p.bounds:
        return a, 0.0
    return a, np.abs(slope) * dh + p.storage * (np.abs(a) + np.abs(h))


def gated(g, dg, v, dv, p: Precision, name: str):
    """SwiGLU's act(gate) * value, with the gate's and the value's errors carried."""
    a, da = gelu(g, dg, p, name)
    y = a * v
    if not p.bounds:
        return y, 0.0
    return y, da * np.abs(v) + np.abs(a) * dv + p.storage * np.abs(y)


_HEADS_AT_ONCE = 1 << 23  # attention weights (elements) computed at once: a few heads of a large model


def _by_heads(fn, P_shape, *arrays):
    """``fn`` over chunks of the leading (batch, head) axes of ``arrays``, its (value, bound)
    written into whole arrays of ``P_shape``'s leading axes: every row is computed as whole (the
    softmax and its bound are per query row), and a full-size model's temporaries are a chunk's,
    not B·H·N² each (ViT-g/14 at 518: 45 M elements an image)."""
    lead = P_shape[:-2]
    rows = math.prod(lead)
    step = max(1, _HEADS_AT_ONCE // (P_shape[-2] * P_shape[-1]))
    flat = [np.broadcast_to(a, (*lead, *a.shape[-2:])).reshape(rows, *a.shape[-2:]) for a in arrays]
    value = bound = None
    for i in range(0, rows, step):
        v, b = fn(*(a[i : i + step] for a in flat))
        if value is None:
            value = np.empty((rows, *v.shape[1:]), v.dtype)
            bound = np.empty((rows, *v.shape[1:])) if np.ndim(b) else b
        value[i : i + step] = v
        if np.ndim(b):
            bound[i : i + step] = b
    shape = (*lead, *value.shape[1:])
    return value.reshape(shape), bound.reshape(shape) if np.ndim(bound) else bound


def _large_attention(P_shape, mask) -> bool:
    return mask is None and math.prod(P_shape) > _HEADS_AT_ONCE and len(P_shape) > 2


def softmax_weights(q, k, scale, p: Precision, mask=None):
    """softmax(scale q kᵀ + mask) over keys and its unit bound (a few heads at a time where the
    weights are large)."""
    P_shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    if _large_attention(P_shape, mask):
        return _by_heads(lambda q_, k_: _softmax_weights(q_, k_, scale, p), P_shape, q, k)
    return _softmax_weights(q, k, scale, p, mask)


def _softmax_weights(q, k, scale, p: Precision, mask=None):
    logits = scale * (q @ np.swapaxes(k, -2, -1))
    if mask is not None:
        mask = np.asarray(mask)
        logits = np.where(mask, logits, -np.inf) if mask.dtype == np.bool_ else logits + mask
    P = O.softmax(logits, axis=-1)
    if not p.bounds:
        return P, 0.0
    A = scale * np.sqrt((q * q) @ np.swapaxes(k * k, -2, -1))
    live = P > 0
    finite = np.where(np.isfinite(logits), logits, 0.0)
    m = np.max(np.where(live, finite, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    E = p.compute * (math.sqrt(q.shape[-1]) * A + np.abs(finite - m) + 1.0) + p.storage * (np.abs(finite) + A)
    E = np.where(live, E, 0.0)
    # A logit off by E_j moves its weight by a factor up to exp(E_j), and the normaliser by up to
    # exp(Ē) with Ē = log Σ_k P_k exp(E_k) (= Σ P E to first order): P expm1(E_j + Ē), at most 1.
    with np.errstate(divide="ignore"):
        shifted = np.where(live, E + np.log(np.where(live, P, 1.0)), -np.inf)
    top = np.max(shifted, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a fully masked row: no weight, no bound
        E_bar = top + np.log(np.sum(np.exp(shifted - top), axis=-1, keepdims=True))
    bound = np.minimum(P * np.expm1(np.minimum(E + E_bar, 80.0)), 1.0) + p.output * P + p.tiny
    return P, bound


def attend(P, dP, v, p: Precision):
    """P v over keys (B, H, Nq, hd) and its bound, with P's own error dP carried (a few heads at a
    time where P is large)."""
    if p.bounds and _large_attention(P.shape, None) and (dP is None or np.ndim(dP) >= 2):
        if dP is None:
            return _by_heads(lambda P_, v_: _attend(P_, None, v_, p), P.shape, P, v)
        return _by_heads(lambda P_, dP_, v_: _attend(P_, dP_, v_, p), P.shape, P, dP, v)
    return _attend(P, dP, v, p)


def _attend(P, dP, v, p: Precision):
    o = P @ v
    if not p.bounds:
        return o, 0.0
    m = np.sqrt((P * P) @ (v * v))
    do = p.compute * math.sqrt(v.shape[-2]) * m + p.storage * m + p.output * np.abs(o)
    if dP is not None:
        do = do + np.sqrt((dP * dP) @ (v * v))
    return o, do


# ----------------------------------------------------------------------------- stages


def prefix_tokens(s, batch: int) -> list:
    """The class token, then the registers, each broadcast over the batch (those the state has)."""
    return [np.broadcast_to(s[k], (batch, *s[k].shape[1:])) for k in ("cls_token", "reg_token") if k in s]


def _prev(i: int, config: ViTConfig) -> str:
    if i:
        return f"blocks.{i - 1}"
    return "norm_pre" if config.pre_norm else "embed"


def _features(config: ViTConfig) -> str:
    """The tokens the head pools: after the final norm, or the last block's where fc_norm replaces it."""
    return "norm" if not config.use_fc_norm else f"blocks.{config.depth - 1}"


def _heads(y, num_heads: int):
    if np.ndim(y) == 0:  # a bound not computed (``Precision.bounds``)
        return y
    B, N, _ = y.shape
    return y.reshape(B, N, num_heads, -1).transpose(0, 2, 1, 3)


def _rows(s, key: str, rows: slice):
    """Rows of a weight (and of its bias, if the checkpoint has one)."""
    bias = s.get(f"{key}.bias")
    return s[f"{key}.weight"][rows], None if bias is None else bias[rows]


def _mlp_act(x, s, prefix: str, config: ViTConfig, p: Precision, mlp_layer: str = "mlp"):
    """The MLP's activation (fc2's input) from its input x: act(fc1 x), or SwiGLU's act(gate) * value."""
    act = config.act_layer
    if mlp_layer == "mlp":
        h, dh = linear(x, *_rows(s, f"{prefix}.fc1", slice(None)), p)
        return gelu(h, dh, p, act)
    if mlp_layer == "swiglu":
        (g, dg), (v, dv) = (linear(x, *_rows(s, f"{prefix}.{fc}", slice(None)), p) for fc in ("fc1_g", "fc1_x"))
    else:  # swiglu_packed: fc1's rows are the gate, then the value
        half = config.mlp_hidden_dim // 2
        (g, dg), (v, dv) = (
            linear(x, *_rows(s, f"{prefix}.fc1", rows), p) for rows in (slice(0, half), slice(half, None))
        )
    return gated(g, dg, v, dv, p, act)


def _scaled(x, gamma, p: Precision):
    """LayerScale: x * gamma, one rounding."""
    y = x * gamma
    return y, p.output * np.abs(y)


def _resampled_pos_embed(pos, config: ViTConfig, images, p: Precision):
    """The position embedding at the images' grid (dynamic_img_size) and its bound: two
    separable passes of the antialiased bicubic, each a contraction over a few taps with
    weights of both signs, in float32, then stored. The weights themselves are computed in
    float32 by torch (ATen's aa kernel): each is off by up to about u (n_in + 4) absolute, as
    the source position scale (i + 0.5) is rounded (measured: 15.5 u for 16 -> 37)."""
    grid = (images.shape[2] // config.patch_size[0], images.shape[3] // config.patch_size[1])
    if grid == config.grid_size:
        return pos, 0.0
    n = 0 if config.no_embed_class else config.num_prefix_tokens
    new = O.resample_pos_embed(pos, config.grid_size, grid, n)
    if not p.bounds:
        return new, 0.0
    Rh, Rw = (np.abs(bicubic_aa_matrix(o, g)) for o, g in zip(config.grid_size, grid))
    g = np.abs(pos[:, n:]).reshape(pos.shape[0], *config.grid_size, pos.shape[-1])
    flat = (pos.shape[0], -1, pos.shape[-1])
    m = np.einsum("ih,bhwd,jw->bijd", Rh, g, Rw).reshape(flat)
    m_h = np.einsum("ih,bhwd,jw->bijd", (Rh > 0).astype(float), g, Rw).reshape(flat)  # weight errors along h
    m_w = np.einsum("ih,bhwd,jw->bijd", Rh, g, (Rw > 0).astype(float)).reshape(flat)
    taps = math.sqrt(np.count_nonzero(Rh, 1).max()) + math.sqrt(np.count_nonzero(Rw, 1).max())
    (oh, ow) = config.grid_size
    stored = 0.0 if p.dtype in ("float32", "float64") else p.storage  # the table held in a lower dtype
    bound = (
        p.compute * (taps + 1.0) * m
        + p.compute * ((oh + 4) * m_h + (ow + 4) * m_w)
        + stored * m
        + p.storage * np.abs(new[:, n:])
    )
    return new, np.concatenate([np.zeros_like(pos[:, :n]), bound], 1)


def _sum(a, b, p: Precision):
    """a + b, a a tap the port may have held more precisely than it emits (one rounding of it)."""
    y = a + b
    return y, p.output * (np.abs(a) + np.abs(b)) + p.inputs * np.abs(a)


def _pool(x, config: ViTConfig, p: Precision):
    """avg, max or avgmax over the tokens (axis 1): mean accumulated in float32, max exact."""
    mean = x.mean(1)
    dmean = p.compute * math.sqrt(x.shape[1]) * np.sqrt((x * x).mean(1)) + p.output * np.abs(mean)
    if config.global_pool == "avg":
        return mean, dmean
    top = x.max(1)
    if config.global_pool == "max":
        return top, np.zeros_like(top)
    y = 0.5 * (top + mean)
    return y, 0.5 * dmean + p.output * (np.abs(top) + np.abs(y))


def evaluate(
    name: str,
    t: Mapping[str, np.ndarray],
    images: np.ndarray,
    s: Mapping[str, np.ndarray],
    config: ViTConfig,
    p: Precision,
):
    """(oracle value, unit bound) of stage ``name`` from its inputs ``t`` (float64)."""
    eps = config.norm_eps
    H, hd = config.num_heads, config.head_dim
    if name == "patch_embed":
        (ph, pw), w = config.patch_size, s["patch_embed.proj.weight"]
        B, C, Hi, Wi = images.shape
        images = images[:, :, : Hi // ph * ph, : Wi // pw * pw]  # the convolution leaves the remainder unread
        patches = (
            images.reshape(B, C, Hi // ph, ph, Wi // pw, pw).transpose(0, 2, 4, 1, 3, 5).reshape(B, -1, C * ph * pw)
        )
        return linear(patches, w.reshape(w.shape[0], -1), s.get("patch_embed.proj.bias"), p)
    if name == "embed":
        x = t["patch_embed"]
        pos, dpos = _resampled_pos_embed(s["pos_embed"], config, images, p)
        prefix = prefix_tokens(s, x.shape[0])
        if config.no_embed_class:  # the prefix tokens pass as stored: one rounding to the dtype
            y, bound = _sum(x, pos, p)
            bound = bound + dpos
            return np.concatenate(prefix + [y], 1), np.concatenate([p.storage * np.abs(a) for a in prefix] + [bound], 1)
        y, bound = _sum(np.concatenate(prefix + [x], 1), pos, p)
        return y, bound + dpos
    if name == "norm_pre":
        return layer_norm(t["embed"], s["norm_pre.weight"], s["norm_pre.bias"], eps, p)
    if name == "norm":
        return layer_norm(t[f"blocks.{config.depth - 1}"], s["norm.weight"], s["norm.bias"], eps, p)
    if name.startswith("attn_pool"):
        return _attn_pool(name, t, images.shape[0], s, config, p)
    if name == "pooled":
        if config.global_pool == "map":
            x = t["attn_pool"]
            y, dy = x, p.storage * np.abs(x)
        elif config.global_pool == "token":
            y = t[_features(config)][:, 0]
            dy = p.inputs * np.abs(y)
        else:
            y, dy = _pool(t[_features(config)][:, config.num_prefix_tokens :], config, p)
        if not config.use_fc_norm:
            return y, dy + p.output * np.abs(y)
        return layer_norm(y, s["fc_norm.weight"], s["fc_norm.bias"], eps, p, dx=dy)
    if name == "logits":
        if not config.num_classes:
            return t["pooled"], p.storage * np.abs(t["pooled"])
        return linear(t["pooled"], s["head.weight"], s["head.bias"], p)
    _, i, *rest = name.split(".", 2)
    b, rest = f"blocks.{i}", (rest[0] if rest else "")
    inputs = [t.get(k) for k in stage_inputs(name, config)]
    if rest == "norm1":
        return layer_norm(inputs[0], s[f"{b}.norm1.weight"], s[f"{b}.norm1.bias"], eps, p)
    if rest in ("attn.q", "attn.k", "attn.v"):
        D, j = config.embed_dim, "qkv".index(rest[-1])
        y, bound = linear(inputs[0], *_rows(s, f"{b}.attn.qkv", slice(j * D, (j + 1) * D)), p)
        return _heads(y, H), _heads(bound, H)
    if rest in ("attn.q_norm", "attn.k_norm"):
        n = rest.split(".")[1]
        return layer_norm(inputs[0], s[f"{b}.attn.{n}.weight"], s[f"{b}.attn.{n}.bias"], eps, p)
    if rest == "attn.weights":
        return softmax_weights(inputs[0], inputs[1], hd**-0.5, p)
    if rest == "attn":
        return _attend_and_project(inputs[0], inputs[1], s, f"{b}.attn.proj", p)
    if rest in ("ls1", "ls2"):
        return _scaled(inputs[0], s[f"{b}.{rest}.gamma"], p)
    # A summand may enter the residual more precisely than its tap shows (XLA fuses x + h * gamma
    # into one loop; a port computing in float64 emits float32 taps): its tap's rounding,
    # u |attn| and u |mlp|, is then a difference too.
    if rest == "norm2":
        r = inputs[0] + inputs[1]
        dx = p.output * np.abs(r) + p.inputs * np.abs(inputs[1])
        return layer_norm(r, s[f"{b}.norm2.weight"], s[f"{b}.norm2.bias"], eps, p, dx=dx)
    if rest == "mlp.act":
        return _mlp_act(inputs[0], s, f"{b}.mlp", config, p, config.mlp_layer)
    if rest == "mlp":
        return linear(inputs[0], *_rows(s, f"{b}.mlp.fc2", slice(None)), p)
    if rest == "":
        r = inputs[0] + inputs[1]
        y = r + inputs[2]
        return y, p.output * (np.abs(r) + np.abs(y)) + p.inputs * (np.abs(inputs[1]) + np.abs(inputs[2]))
    raise KeyError(f"no error model for stage {name!r}")


def _attend_and_project(P, v, s, proj: str, p: Precision):
    """proj(merge_heads(P v)), with the attention output's own error carried through proj."""
    o, do = attend(P, None, v, p)
    w, bias = _rows(s, proj, slice(None))
    y, bound = linear(O.merge_heads(o), w, bias, p)
    return y, (bound + propagate_linear(O.merge_heads(do), w)) if p.bounds else 0.0


def _attn_pool(name: str, t, batch: int, s, config: ViTConfig, p: Precision):
    """timm's AttentionPoolLatent: the latent's query over the patch tokens, then x + mlp(norm(x))."""
    H, D = config.num_heads, config.embed_dim
    stage = name[len("attn_pool.") :] if name != "attn_pool" else ""
    if stage == "q":
        latent = np.broadcast_to(s["attn_pool.latent"], (batch, 1, D))
        y, bound = linear(latent, *_rows(s, "attn_pool.q", slice(None)), p)
        return _heads(y, H), _heads(bound, H)
    if stage in ("k", "v"):
        x = t[_features(config)][:, config.num_prefix_tokens :]
        rows = slice(0, D) if stage == "k" else slice(D, 2 * D)
        y, bound = linear(x, *_rows(s, "attn_pool.kv", rows), p)
        return _heads(y, H), _heads(bound, H)
    if stage == "weights":
        return softmax_weights(t["attn_pool.q"], t["attn_pool.k"], config.head_dim**-0.5, p)
    if stage == "proj":
        return _attend_and_project(t["attn_pool.weights"], t["attn_pool.v"], s, "attn_pool.proj", p)
    if stage == "norm":
        return layer_norm(t["attn_pool.proj"], s["attn_pool.norm.weight"], s["attn_pool.norm.bias"], config.norm_eps, p)
    if stage == "mlp.act":
        return _mlp_act(t["attn_pool.norm"], s, "attn_pool.mlp", config, p)
    if stage == "mlp":
        return linear(t["attn_pool.mlp.act"], *_rows(s, "attn_pool.mlp.fc2", slice(None)), p)
    y, bound = _sum(t["attn_pool.proj"], t["attn_pool.mlp"], p)
    return y[:, 0], bound[:, 0]


class BeyondRange(Exception):
    """A streamed case's oracle reached beyond the dtype's range (found as the run reached it):
    the case is not judged (``Chain.beyond_range``)."""


@lru_cache(maxsize=1)
def pool():
    """Threads for a streamed case's work beside the clean run (each noisy run's steps, the local
    checks): NumPy runs its elementwise functions and random draws on one core. A task waits at
    most on one submitted before it (a noisy run's step before), so on one running or done; more
    threads than cores, as a few wait. Run them under ``parallel()``."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=6, thread_name_prefix="error-model")


@lru_cache(maxsize=1)
def beside():
    """A thread for a part of a streamed clean step, beside the rest of it (its tasks wait on nothing)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="clean-step")


def parallel():
    """NumPy's BLAS on one core per call while the pool's threads run: several BLAS calls at once,
    each on all cores, contend (OpenBLAS's threads spin), where one core each does not."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


@lru_cache(maxsize=16)
def _skipped(seed: int, draws: int, runs: int = 1) -> tuple[dict, ...]:
    """The states of ``default_rng(seed)`` after r x ``draws`` standard normals, r = 1 .. ``runs``,
    drawn once (a normal takes a varying number of the generator's words, so the only way there is
    to draw them)."""
    rng, chunk, states = np.random.default_rng(seed), np.empty(1 << 20), []
    for _ in range(runs):
        left = draws
        while left > 0:
            n = min(left, chunk.size)
            rng.standard_normal(out=chunk[:n])
            left -= n
        states.append(rng.bit_generator.state)
    return tuple(states)


class _Runs:
    """The clean run and the noisy runs of a chain, a stage at a time.

    A noisy run perturbs every stage's value, computed from that run's own inputs, by
    N(0, bound²), the bound the clean run derived there (it differs from the noisy inputs' own by
    the inputs' relative perturbation, of the dtype's roundoff: a value alone is a third of the
    cost of a value with its bound). Run r draws from one generator where run r − 1 stops, as if
    the runs went one after another. ``held``: every stage's clean value is kept (a small model's
    case, read by many ports and in any order), each step's noisy runs done with it; otherwise
    each clean value is let go once the stages that read it are past (a full-size case's oracle is
    never whole in memory: read it in model order), and each noisy run goes on in the pool a step
    behind the clean run, its steps one after another, at most ``BEHIND`` steps behind (what they
    hold: those steps' tapes and bounds)."""

    BEHIND = 2

    def __init__(self, chain: "Chain", held: bool):
        self.chain, self.held = chain, held
        self.last = chain.last_readers()
        sizes = chain.sizes()
        total = sum(sizes.values())
        # At least ``noisy_runs``, and up to 8 on small models, so that a stage of a few elements (the
        # logits of one image) is not judged by the luck of two draws (the largest of 8 |N(0, 1)| is
        # below 0.3 once in 10⁵).
        self.runs = max(chain.noisy_runs, min(8, int(4e6 // max(total, 1))))
        # run r's generator where run r - 1's stops; streamed, skipped there in the pool while the
        # first clean step runs (a full-size case's skip is tens of millions of draws)
        self.rngs = [np.random.default_rng(chain.seed)]
        # ``skipped()``: the other runs' generator states, at the first step
        if held:  # one run's draws after another's
            states = _skipped(chain.seed, total, self.runs - 1)
            self.skipped = lambda: states
        else:  # or side by side in the pool
            futures = [pool().submit(_skipped, chain.seed, r * total) for r in range(1, self.runs)]
            self.skipped = lambda: [f.result()[0] for f in futures]
        self.done = 0  # stages computed, in model order
        self.clean: dict[str, np.ndarray] = {}
        self.noisy: list[dict[str, np.ndarray]] = [{} for _ in range(self.runs)]
        self.spread: dict[str, float] = {}
        self.pending: dict[str, list] = {}  # streamed: each step's noisy runs in the pool, oldest first
        self.tapes: dict[str, Tape] = {}  # streamed: the last step's tape, for its local check to follow
        self.largest = 0.0
        self.limit = LARGEST["float16" if chain.precision.dtype == "float16" else "float32"] / 2

    def value(self, name: str) -> np.ndarray:
        names = self.chain.names
        if name not in self.clean:
            if names.index(name) < self.done:
                raise KeyError(f"stage {name!r} was let go: a streamed oracle is read in model order")
            while self.done <= names.index(name):
                self._step()
        return self.clean[name]

    def spread_of(self, name: str) -> float:
        if name not in self.spread and name not in self.pending:  # not reached yet (or let go: raises)
            self.value(name)
        while name not in self.spread:
            self._settle_oldest()
        return self.spread[name]

    def finish(self) -> None:
        while self.done < len(self.chain.names):
            self._step()
        while self.pending:
            self._settle_oldest()

    def _step(self) -> None:
        while len(self.pending) >= self.BEHIND:
            self._settle_oldest()
        chain, i = self.chain, self.done
        name = chain.names[i]
        tape = Tape()
        with tape.recording():
            value, bound = chain.evaluate(name, self.clean)
        value = np.asarray(value, np.float64)
        self.largest = max(self.largest, float(np.abs(value).max(initial=0.0)))
        if not self.held and self.largest > self.limit:
            raise BeyondRange(f"the oracle reaches {self.largest:.3g}, beyond {chain.precision.dtype}'s range")
        bound = np.broadcast_to(bound, value.shape)
        quiet = replace(chain.precision, bounds=False)
        let_past = [k for k in self.last if self.last[k] <= i]  # no stage after this one reads them

        def perturbed(r: int, before=None) -> float:
            """Run r's value from its own inputs, following the clean step, perturbed (each run its
            own generator: the same draws in any order), once its step before is done."""
            if before is not None:
                before.result()
            with tape.following():
                v = np.asarray(chain.evaluate(name, self.noisy[r], quiet)[0], np.float64)
            noise = self.rngs[r].standard_normal(v.shape)
            noise *= bound
            v = np.add(v, noise, out=noise)  # v + noise x bound, in the draws' array
            self.noisy[r][name] = v
            spread = float(np.abs(v - value).max(initial=0.0))
            for k in let_past:
                self.noisy[r].pop(k, None)
            return spread

        runs = range(self.runs)
        if self.skipped is not None:  # the first step: the other runs' generators, once skipped there
            for state in self.skipped():
                rng = np.random.default_rng(chain.seed)
                rng.bit_generator.state = state
                self.rngs.append(rng)
            self.skipped = None
        self.clean[name] = value
        self.done = i + 1
        if self.held:
            self.spread[name] = max(map(perturbed, runs))
            return
        # Each run's step after its step before, in the pool: FIFO, so a step waits only on one
        # already running or done. Beside them the clean run goes on, and what reads it.
        before = list(self.pending.values())[-1] if self.pending else [None] * self.runs
        self.pending[name] = [pool().submit(perturbed, r, before[r]) for r in runs]
        self.tapes = {name: tape}  # the comparison takes it for the local check as it reads the value
        for k in [k for k in self.clean if self.last[k] < i]:  # past their last reader and their own step
            del self.clean[k]

    def _settle_oldest(self) -> None:
        name = next(iter(self.pending))
        self.spread[name] = max(f.result() for f in self.pending.pop(name))


class _Oracle(Mapping):
    """A chain's clean run as a mapping of its stages (``_Runs``)."""

    def __init__(self, runs: _Runs):
        self._runs = runs

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._runs.chain.names:
            raise KeyError(name)
        return self._runs.value(name)

    def __iter__(self):
        return iter(self._runs.chain.names)

    def __len__(self) -> int:
        return len(self._runs.chain.names)


class Chain:
    """A computation as named stages, each evaluated from earlier ones with its unit bound.

    ``oracle`` is the clean run; ``local`` a stage from the port's own inputs; ``spread`` the
    propagated bound's scale, from runs with every stage perturbed by N(0, unit bound²).
    ``stream``: the clean run is computed as it is read, in model order, and not held (``_Runs``)."""

    names: tuple[str, ...] = ()

    def __init__(
        self, precision: Precision | str = "float32", noisy_runs: int = 2, seed: int = 0, stream: bool = False
    ):
        self.precision = Precision(precision) if isinstance(precision, str) else precision
        self.noisy_runs, self.seed, self.stream = noisy_runs, seed, stream
        self._runs: _Runs | None = None

    def _run(self) -> _Runs:
        if self._runs is None:
            self._runs = _Runs(self, held=not self.stream)
        return self._runs

    @property
    def oracle(self) -> Mapping[str, np.ndarray]:
        """The clean run, each stage computed on first use (a local check alone needs none)."""
        return _Oracle(self._run())

    def inputs(self, name: str) -> tuple[str, ...]:
        raise NotImplementedError

    def last_readers(self) -> dict[str, int]:
        """Each stage's place, in model order, of the last stage that reads it (or its own): what
        a run going in model order may let go once past it."""
        last = {n: i for i, n in enumerate(self.names)}
        for i, n in enumerate(self.names):
            for k in self.inputs(n):
                last[k] = max(last.get(k, i), i)
        return last

    def evaluate(self, name: str, t: Mapping[str, np.ndarray], precision: Precision | None = None):
        """(value, unit bound) of stage ``name`` from its inputs ``t``, in ``precision`` (default:
        the chain's)."""
        raise NotImplementedError

    def sizes(self) -> dict[str, int]:
        """Each stage's number of elements (before anything is computed)."""
        raise NotImplementedError

    def kind(self, name: str) -> str:
        """The stage kind whose calibrated tolerance applies."""
        raise NotImplementedError

    def local(
        self, name: str, taps: Mapping[str, np.ndarray], precision: Precision | None = None, tape: Tape | None = None
    ):
        """(oracle value, unit bound) of ``name`` computed from the port's own inputs ``taps``, in
        ``precision`` (default: the chain's; mixed precision: the stage's as emitted). ``tape``:
        the clean step's, followed where the port's inputs are near the oracle's (``Tape``)."""
        t = {k: np.asarray(taps[k], np.float64) for k in self.inputs(name)}
        with tape.following() if tape is not None else nullcontext():
            return self.evaluate(name, t, precision)

    def beyond_range(self) -> str | None:
        """Why no port can represent this case in its dtype (the oracle reaches half the dtype's
        largest finite value somewhere: judging it would be a false alarm), or None. Streamed, it
        is found as the run reaches it: reading the oracle then raises ``BeyondRange``."""
        if self.stream:
            return None
        runs = self._run()
        runs.finish()
        if runs.largest > runs.limit:
            return f"the oracle reaches {runs.largest:.3g}, beyond {self.precision.dtype}'s range"
        return None

    def settle(self) -> None:
        """The rest of the run, where the comparison did not read it (``BeyondRange`` if it is)."""
        self._run().finish()

    def can_check_locally(self, name: str, taps) -> bool:
        return all(k in taps for k in self.inputs(name))

    def spread(self, name: str) -> float:
        """max |noisy − oracle| at ``name`` over the noisy runs (``_Runs``)."""
        return self._run().spread_of(name)

    def tape(self, name: str) -> Tape | None:
        """A streamed run's tape of ``name``'s clean step, where it is the last one (``local``
        follows it)."""
        return self._run().tapes.get(name) if self.stream else None


class _Float64(Mapping):
    """A state's arrays in float64 as each is read: a full-size model's weights are not held
    twice (float32 and float64) for the length of a case."""

    def __init__(self, state: Mapping[str, np.ndarray]):
        self._state = state

    def __getitem__(self, key: str) -> np.ndarray:
        weight = self._state[key]
        try:
            return np.asarray(weight, np.float64)
        finally:
            let_go(weight)  # mapped from the file written for the port: not resident past the copy

    def __iter__(self):
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


class CaseModel(Chain):
    """The error model of one whole-model case: config, canonical state, images, dtype.
    ``stream``: the oracle is computed as compare reads it and let go (a full-size case)."""

    def __init__(
        self,
        config: ViTConfig,
        state: Mapping[str, np.ndarray],
        images: np.ndarray,
        precision: Precision | str = "float32",
        noisy_runs: int = 2,
        seed: int = 0,
        stream: bool = False,
    ):
        super().__init__(precision, noisy_runs, seed, stream)
        self.config = config
        self.images = np.asarray(images)
        # small models: float64 once (read by every stage of up to eight noisy runs); full size: as used
        small = sum(np.size(v) for v in state.values()) < 4e6
        self._s = {k: np.asarray(v, np.float64) for k, v in state.items()} if small else _Float64(state)
        self._x = np.asarray(images, np.float64)
        self.names = tuple(tap_names(config))

    def inputs(self, name):
        return stage_inputs(name, self.config)

    def evaluate(self, name, t, precision=None):
        return evaluate(name, t, self._x, self._s, self.config, precision or self.precision)

    def sizes(self):
        shapes = tap_shapes(self.config, self.images.shape[0], self.images.shape[2:])
        return {name: math.prod(shapes[name]) for name in self.names}

    def kind(self, name):
        return stage_kind(name)


ATTENTION_STAGES = ("attn.q", "attn.k", "attn.v", "attn.weights", "attn")


class AttentionModel(Chain):
    """The error model of a standalone (cross-)attention: q from x, k and v from the context
    (timm's AttentionPoolLatent weights ``q``, ``kv``, ``proj``), an optional mask."""

    names = ATTENTION_STAGES

    def __init__(
        self,
        options: Mapping,
        state: Mapping[str, np.ndarray],
        x,
        context=None,
        mask=None,
        precision: Precision | str = "float32",
        noisy_runs: int = 2,
        seed: int = 0,
    ):
        super().__init__(precision, noisy_runs, seed)
        self.options = dict(options)
        self._s = {k: np.asarray(v, np.float64) for k, v in state.items()}
        self._x = np.asarray(x, np.float64)
        self._ctx = self._x if context is None else np.asarray(context, np.float64)
        self._mask = mask

    def inputs(self, name):
        return {
            "attn.q": (),
            "attn.k": (),
            "attn.v": (),
            "attn.weights": ("attn.q", "attn.k"),
            "attn": ("attn.weights", "attn.v"),
        }[name]

    def kind(self, name):
        return "mha." + name.split(".", 1)[1] if "." in name else "mha.out"

    def evaluate(self, name, t, precision=None):
        o, s, p = self.options, self._s, precision or self.precision
        H = o["num_heads"]
        hd = o.get("head_dim") or o["dim"] // H
        inner = H * hd
        if name == "attn.q":
            y, bound = linear(self._x, s["q.weight"], s.get("q.bias"), p)
        elif name in ("attn.k", "attn.v"):
            rows = slice(0, inner) if name == "attn.k" else slice(inner, 2 * inner)
            bias = s.get("kv.bias")
            y, bound = linear(self._ctx, s["kv.weight"][rows], None if bias is None else bias[rows], p)
        elif name == "attn.weights":
            return softmax_weights(t["attn.q"], t["attn.k"], hd**-0.5, p, self._mask)
        else:
            return _attend_and_project(t["attn.weights"], t["attn.v"], s, "proj", p)
        return O.split_heads(y, H), O.split_heads(bound, H) if p.bounds else 0.0

    def sizes(self):
        o = self.options
        H = o["num_heads"]
        hd = o.get("head_dim") or o["dim"] // H
        (B, Nq), Nk = self._x.shape[:2], self._ctx.shape[1]
        return {
            "attn.q": B * H * Nq * hd,
            "attn.k": B * H * Nk * hd,
            "attn.v": B * H * Nk * hd,
            "attn.weights": B * H * Nq * Nk,
            "attn": B * Nq * self._s["proj.weight"].shape[0],
        }


def sdpa(q, k, v, mask=None, scale=None, precision: Precision | str = "float32"):
    """softmax(scale q kᵀ + mask) v from given q, k, v: (out, out bound, weights, weights bound)."""
    p = Precision(precision) if isinstance(precision, str) else precision
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    P, dP = softmax_weights(q, k, scale, p, mask)
    out, dout = attend(P, dP, v, p)
    return out, dout, P, dP


def stage_precision(kind: str, asked: str, output: str, inputs=()) -> Precision:
    """A stage's roundings from what the port emitted: ``output`` the stage's storage as seen,
    ``inputs`` its input taps' (the coarsest counts). A stage emitted in the dtype asked for is
    judged as a port computing in that dtype; one emitted in float32 (mixed precision) has float32
    roundings, but for a contraction's operands, which may still be in the dtype asked for."""
    if output == asked:
        return Precision(asked)
    operands = asked if kind in CONTRACTIONS else output
    return Precision(operands, output_dtype=output, input_dtype=coarsest(inputs) if inputs else operands)
