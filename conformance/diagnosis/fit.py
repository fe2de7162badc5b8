"""Which bug class a divergent stage shows: each class fitted to the port's error.

At the stage where a port first diverges, for each class that can exist there
(``classes.classes_for``): the port's error ``e = port − oracle`` and the class's difference
``d = oracle_h − oracle``, both from the port's own inputs to the stage (where the port did not emit
an input, it is computed from the nearest inputs it did, the class applied on the way: a port that
returns only logits is fitted end to end). Weighting each element by the oracle's bound ``b`` (the
local unit bound, or the propagated spread end to end), the least-squares coefficient and its
standard error

    α = Σ e d / b² ÷ Σ d² / b²,   σ_α = rms((e − α d) / b) / √(Σ d² / b²),

the scatter left by the fit being the port's rounding (the oracle's variant reproduces a class's
difference to about ``FLOOR``, 1%: a precision class emulates the port's dtype, not its order of
summation). The residual ``max |e − α d| / max(b, b_h)`` is told over the tolerance. A class is **named** only
when ``σ_α ≤ 0.03`` (the stage tells the class apart from nothing), ``|α − 1| ≤ 3 σ_α + FLOOR`` and
the residual is within the tolerance: the error *is* the class's difference, nothing left over. A stage the port
emitted as NaN or Inf is matched by where: a class (computed in the dtype its bug rounds in) that
is non-finite nowhere the port is finite and at ``COVERED`` (half) of its non-finite elements or
more (where a product overflows near the dtype's limit depends on the port's order of summation).
A LayerNorm's fast variance is a family, fitted per token (``token_statistics``). Two classes that both match are named
together (the cases cannot tell them apart); none: "no known bug class matches", and the closest
two with their figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from conformance.diagnosis.classes import (
    ACTIVE_DROPOUT,
    ATTENTION_CLASSES,
    BY_NAME,
    GRADIENT_CLASSES,
    QUIET,
    BugClass,
    classes_for,
    evaluate_variant,
)
from conformance.diagnosis.model_classes import layer_norm_as, norm_operands
from conformance.numerics.compare import malformed, relative_spread, stored_as
from conformance.numerics.error_model import CaseModel, attend_and_project, evaluate, stage_precision
from conformance.numerics.tolerances import end_to_end_tolerance, tolerance
from conformance.report import describe_exception
from impls.protocol import tap_shapes

SIGMAS = 3.0  # |α − 1| within this many standard errors, plus FLOOR
FLOOR = 0.01  # how closely the oracle's variant reproduces a class's difference
RESOLVED = 0.03  # σ_α at most this: the class's difference stands out of the rounding
COVERED = 0.5  # a non-finite class: at least this share of the port's non-finite elements
# A class not named is told as close only within NEAR_SIGMAS standard errors of α = 1 (plus
# NEAR_FLOOR) with a residual below FAR times the tolerance; else how far off the nearest is
NEAR_SIGMAS, NEAR_FLOOR, FAR = 5.0, 0.05, 100.0


@dataclass
class Fit:
    bug: str
    alpha: float | None  # None: matched by where the stage is non-finite
    se: float | None  # σ_α
    residual: float  # max |e − α d| / max(b, b_h) over the tolerance (≤ 1: within it)
    named: bool
    per_token: bool = False  # a family fitted per token (``se``: its largest δ in float32 roundings of μ² + σ²)
    distance: float = float("inf")  # max |e − d| / max(b, b_h) over the tolerance: how far the port is from the class
    detail: str = ""  # a family's member, told after what the class says (" (eps ≈ 1e-03)")
    family: bool = False  # fitted over a family (per token, a grid of eps): after one-coefficient classes

    @property
    def near(self) -> bool:
        """Close enough to be told as the closest class: α within a few standard errors of 1 (or
        matched where non-finite), and no residual orders of magnitude over the tolerance."""
        if self.alpha is None or self.per_token:
            return True
        close = self.se is not None and abs(self.alpha - 1) <= NEAR_SIGMAS * self.se + NEAR_FLOOR
        return close and not self.residual >= FAR

    def figures(self) -> str:
        if self.per_token:
            return f"each token's variance off by up to {self.se:.3g} u (μ² + σ²), residual {self.residual:.2g} of the tolerance"
        if self.alpha is None:
            return f"non-finite at {self.se:.0%} of the port's non-finite elements" + (
                "" if self.named else ", or elsewhere"
            )
        if np.isnan(self.residual):  # pooled over cases (scan): each element within the tolerance
            return f"α = {self.alpha:.3f} ± {self.se:.2g} pooled over the cases"
        return f"α = {self.alpha:.3f} ± {self.se:.2g}, residual {self.residual:.2g} of the tolerance"


@dataclass
class Diagnosis:
    stage: str
    case: str
    mode: str  # "local" or "end-to-end"
    named: str | None  # the class, or None: no known class matches
    fits: list[Fit] = field(default_factory=list)  # the named one first, then the closest
    failed: str = ""  # the tool's own exception while fitting (the verdict stands)

    @property
    def bug(self) -> BugClass | None:
        return BY_NAME.get(self.named) if self.named else None

    def line(self) -> str:
        if self.failed:
            return f"{self.stage}: the diagnosis failed, a bug of this tool and not of the port: {self.failed}"
        if self.named and not self.fits:  # observed, not fitted
            return f"{self.stage}: the port computes {self.bug.says}; {self.bug.hint}"
        if self.named:
            bug, fit = self.bug, self.fits[0]
            also = [f.bug for f in self.fits[1:] if f.named]
            tie = f" (or, indistinguishable on these cases: {', '.join(also)})" if also else ""
            return f"{self.stage}: the port computes {bug.says}{fit.detail} ({fit.figures()}){tie}; {bug.hint}"
        if not self.fits:
            return f"{self.stage}: no known bug class applies to this stage"
        closest = "; ".join(f"{f.bug} ({f.figures()})" for f in self.fits[:2])
        if self.mode == "pooled":  # systematic, but no class at α = 1: the error runs along these
            return f"{self.stage}: a systematic error below the dtype's rounding, along {closest}"
        near = [f for f in self.fits[:2] if f.near]
        if near:
            return f"{self.stage}: no known bug class matches; closest: " + "; ".join(
                f"{f.bug} ({f.figures()})" for f in near
            )
        f = self.fits[0]  # never read as advice: how far off it is
        return f"{self.stage}: no known bug class matches; the nearest, {f.bug}, is far from it ({f.figures()}; a match is α = 1 within the tolerance)"

    def to_dict(self) -> dict:
        bug = self.bug
        return {
            "stage": self.stage,
            "case": self.case,
            "mode": self.mode,
            "class": self.named,
            "says": bug.says if bug else None,
            "hint": bug.hint if bug else None,
            "fits": [asdict(f) for f in self.fits[:3]],
            "line": self.line(),
        }


def guarded(stage: str, case: str, fit) -> Diagnosis:
    """``fit()``, or a diagnosis that says the tool failed (the verdict, the port's, stands)."""

    try:
        return fit()
    except Exception as e:  # the tool's own bug: told as such, never as the port's
        return Diagnosis(stage, case, "error", None, failed=describe_exception(e))


def dropout(stage: str, case: str) -> Diagnosis:
    """Two calls of the port on the same input differ: randomness at inference."""
    return Diagnosis(stage, case, "determinism", ACTIVE_DROPOUT)


def _grid(model):
    """The patch grid of the images a case model ran on."""
    return model.config.grid_at(model.images.shape[2:])


class _Values(Mapping):
    """The stages a fit reads: the port's own where it emitted them well-formed (but the stage
    fitted), the rest computed from those, ``bug`` applied (None: the oracle's operation)."""

    def __init__(self, model: CaseModel, port: Mapping, valid: set, target: str, bug: BugClass | None):
        self.model, self.port, self.valid, self.target, self.bug = model, port, valid, target, bug
        self._s = model._s
        self._cache: dict[str, np.ndarray] = {}
        self._last = model.last_readers()

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.model.names:
            raise KeyError(name)
        if name not in self._cache:
            m = self.model
            if name != self.target and name in self.valid:
                value = np.asarray(self.port[name], np.float64)
            elif self.bug is None:
                value = np.asarray(evaluate(name, self, m._x, self._s, m.config, QUIET)[0], np.float64)
            else:
                value = evaluate_variant(self.bug, name, self, m._x, self._s, m.config)[0]
            # computed in model order from the target down: what no later stage reads is let go
            # (a full-size forward is not held whole)
            i = m.names.index(name)
            for k in [k for k in self._cache if self._last[k] <= i and k != self.target]:
                del self._cache[k]
            self._cache[name] = value
        return self._cache[name]

    def bounded(self, name: str):
        """(value, unit bound or None) of the fitted stage, the bug's own rounding."""
        m = self.model
        if self.bug is None:
            return self[name], None
        value, bound = evaluate_variant(self.bug, name, self, m._x, self._s, m.config, m.precision)
        self._cache[name] = value
        return value, bound

    def __iter__(self):
        return iter(self.model.names)

    def __len__(self) -> int:
        return len(self.model.names)


def well_formed(out: Mapping, model: CaseModel) -> set:
    """The port's stages compare would take as inputs (``compare.malformed``: of the oracle's
    shape, finite, in the dtype asked for or finer)."""
    shapes = tap_shapes(model.config, model.images.shape[0], model.images.shape[2:])
    dtype = model.precision.dtype
    return {n for n in model.names if n in out and malformed(out[n], shapes[n], dtype) is None}


def diagnose(stage: str, out: Mapping, model: CaseModel, dtype: str = "float32", case: str = "") -> Diagnosis:
    """The bug class the port's ``stage`` shows on this case, or the closest two."""
    config = model.config
    kind = model.kind(stage)
    valid = well_formed(out, model)
    local = model.can_check_locally(stage, valid)
    try:
        port = np.asarray(out[stage], np.float64) if stage in out else None
    except (TypeError, ValueError):  # not an array (compare told why)
        port = None
    shapes = tap_shapes(config, model.images.shape[0], model.images.shape[2:])
    if port is None or port.shape != tuple(shapes[stage]):
        return Diagnosis(stage, case, "local" if local else "end-to-end", None)
    base = _Values(model, out, valid, stage, None)[stage]
    if local:  # the stage's rounding as compare judged it (mixed precision: as stored)
        stored = {n: stored_as(out[n], dtype) for n in (stage, *model.inputs(stage))}
        precision = stage_precision(kind, dtype, stored[stage], [stored[n] for n in model.inputs(stage)])
        bound = np.broadcast_to(model.local(stage, out, precision)[1], base.shape) + model.precision.tiny
        tol = tolerance(kind, precision.dtype, "local")
    else:
        spread = model.spread(stage)
        bound = np.full(base.shape, max(spread, model.precision.tiny))
        tol = end_to_end_tolerance(kind, dtype, relative_spread(spread, base))
    fits = []
    # Locally the stage's own classes; end to end any class upstream of it, applied where it acts
    # (each a forward from the nearest emitted taps: a full-size model's, the stage's own only).
    upstream = not local and not model.stream
    candidates = [c for k in (_upstream(stage, model) if upstream else [kind]) for c in classes_for(k, config)]
    for bug in {c.name: c for c in candidates}.values():
        if bug.family is not None:  # a family, fitted from the port's own inputs only
            if local:
                fit = FAMILIES[bug.family]
                fits.append(fit(port, base, _Values(model, out, valid, stage, None), stage, bound, tol, bug.name))
            continue
        alt, alt_bound = _Values(model, out, valid, stage, bug).bounded(stage)
        if alt_bound is None or not local:
            alt_bound = _scaled(bound, alt, base)
        fits.append(_fit(port, base, alt, bound, np.broadcast_to(alt_bound, base.shape), tol, bug.name))
    return _verdict(stage, case, "local" if local else "end-to-end", fits)


def _scaled(bound, alt, base):
    """A class's rounding where the error model has no bound of it: the oracle's, scaled to the
    class's magnitude."""
    return bound * max(1.0, float(np.nanmax(np.abs(alt), initial=0.0)) / max(float(np.abs(base).max()), 1e-300))


def _verdict(stage: str, case: str, mode: str, fits: list) -> Diagnosis:
    """The fits that could be made, the named first (one coefficient before a family), then the
    closest: the class named if the first is."""
    fits = sorted((f for f in fits if f is not None), key=lambda f: (not f.named, f.family, f.distance))
    return Diagnosis(stage, case, mode, fits[0].bug if fits and fits[0].named else None, fits)


CANCELLATION = 64.0  # a float32 E[x^2] - E[x]^2 loses up to this many u (μ² + σ²) (Flax's: 6.1 in the zoo)


def token_statistics(port, base, values, stage: str, bound, tol, name) -> Fit | None:
    """A LayerNorm whose per-token variance is off: per token, the error fitted as a multiple of
    γ x̂ (a variance off by δ scales x̂ by σ / σ') and of γ (a mean off), weighted by the bound;
    named when what is left is within the tolerance and every token's implied δ is within
    ``CANCELLATION`` float32 roundings of μ² + σ² (what E[x^2] - E[x]^2 loses), one beyond any a
    correct port's rounding shows (its error at that token out of the tolerance)."""
    if not np.isfinite(port).all():
        return None
    x, prefix = norm_operands(stage, values, values.model.config, _grid(values.model))
    s = values._s
    w, eps = s[f"{prefix}.weight"], values.model.config.norm_eps
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    xh = (x - mu) / np.sqrt(var + eps)
    e = (port - base) / bound
    a, b = w * xh / bound, np.broadcast_to(w / bound, e.shape)
    # per token: [a b] [c m]ᵀ = e, least squares over the channels
    aa, ab, bb = (a * a).sum(-1), (a * b).sum(-1), (b * b).sum(-1)
    ea, eb = (e * a).sum(-1), (e * b).sum(-1)
    det = aa * bb - ab * ab
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(det > 0, (ea * bb - eb * ab) / det, 0.0)
        m = np.where(det > 0, (eb * aa - ea * ab) / det, 0.0)
    left = e - c[..., None] * a - m[..., None] * b
    residual = float(np.abs(left).max()) / max(tol, 1e-30)
    delta = (var[..., 0] + eps) * ((1.0 + c) ** -2.0 - 1.0)
    scale = 2.0**-24 * (mu[..., 0] ** 2 + var[..., 0])
    off = np.abs(e).max(-1) > tol  # the tokens the port fails at
    explained = bool(off.any()) and bool(np.all(np.abs(delta[off]) <= CANCELLATION * scale[off]))
    ratio = float(np.max(np.abs(delta[off]) / scale[off])) if off.any() else 0.0
    return Fit(
        name, None, ratio, residual, explained and residual <= 1.0, per_token=True, distance=residual, family=True
    )


EPS_GRID = tuple(m * 10.0**e for e in range(-12, 0) for m in (1.0, 3.0))  # 1e-12, 3e-12, ..., 3e-1


def fitted_eps(port, base, values, stage: str, bound, tol, name) -> Fit | None:
    """A LayerNorm with an eps of its own: the class fitted for each eps of ``EPS_GRID`` (the
    config's own aside), the closest kept, its eps told."""
    x, prefix = norm_operands(stage, values, values.model.config, _grid(values.model))
    w, b, own = values._s[f"{prefix}.weight"], values._s.get(f"{prefix}.bias", 0.0), values.model.config.norm_eps
    best = None
    for eps in EPS_GRID:
        if abs(eps / own - 1.0) < 0.5:
            continue
        fit = _fit(port, base, layer_norm_as(x, w, b, eps), bound, bound, tol, name)
        if fit is not None and (best is None or (fit.named, -fit.distance) > (best.named, -best.distance)):
            best = fit
            best.detail = f" (eps ≈ {eps:.0e})"
    if best is not None:
        best.family = True  # after the classes of one coefficient
    return best


def factors(config) -> list[tuple[float, str]]:
    """The constants a port multiplies a stage by where the reference does not (or leaves out
    where it does), each with its name: the Transformer paper's embedding scale √d_model, the
    attention's 1/√head_dim applied twice or not at all, a half, a double, a sign."""
    D, hd = config.embed_dim, config.head_dim
    return [
        (D**0.5, f"√embed_dim = √{D}"),
        (D**-0.5, f"1/√embed_dim = 1/√{D}"),
        (hd**0.5, f"√head_dim = √{hd}"),
        (hd**-0.5, f"1/√head_dim = 1/√{hd}"),
        (2.0, "2"),
        (0.5, "1/2"),
        (-1.0, "-1"),
    ]


def constant_factor(port, base, values, stage: str, bound, tol, name) -> Fit | None:
    """The stage times a constant c (at ``embed`` also the patch tokens times c before the position
    embedding is added, where the Transformer paper scales): the class fitted for each meaningful
    constant (``factors``), then for c fitted by least squares (weighted by the bound), the closest
    kept, c told with its name or as fitted."""
    if not np.isfinite(port).all():
        return None
    w = 1.0 / (bound * bound)
    best = None
    for where, scaled in _multiples(stage, base, values):
        d = scaled(2.0) - base  # what c - 1 adds (each variant is linear in c)
        dd = float(np.sum(d * d * w))
        if dd == 0.0:
            continue
        fitted = 1.0 + float(np.sum((port - base) * d * w)) / dd
        for c, label in [*factors(values.model.config), (fitted, "fitted")]:
            alt = scaled(c)
            fit = _fit(port, base, alt, bound, _scaled(bound, alt, base), tol, name)
            if fit is not None and (best is None or (fit.named, -fit.distance) > (best.named, -best.distance)):
                best = fit
                best.detail = f" (c = {c:.4g}{where}, {label})"
            if best is not None and best.named:
                break  # a meaningful constant before the fitted value
        if best is not None and best.named:
            break  # the whole stage before its inputs
    if best is not None:
        best.family = True  # after the classes of one coefficient
    return best


def _multiples(stage: str, base, values):
    """(where, c -> the stage with a factor c there): the stage itself; at ``embed`` its patch
    tokens, before the prefix tokens and the position embedding join them."""
    yield "", lambda c: c * base
    model = values.model
    if model.kind(stage) == "embed":
        (tokens,) = model.inputs(stage)
        x = values[tokens]

        def scaled(c):
            out = evaluate(stage, {tokens: c * x}, model._x, model._s, model.config, QUIET)[0]
            return np.asarray(out, np.float64)

        yield " on the patch tokens", scaled


# classes.BugClass.family -> its fit
FAMILIES = {"token_statistics": token_statistics, "eps": fitted_eps, "factor": constant_factor}


def diagnose_attention(stage: str, out, model, case: str = "") -> Diagnosis:
    """A standalone attention port's divergent ``attn.weights`` or ``attn`` (end to end: the port
    emits no q, k, v; the oracle's, from the port's inputs, are the classes' too)."""
    port = np.asarray(out, np.float64)
    o = model.oracle
    base = np.asarray(o[stage], np.float64)
    if port.shape != base.shape:
        return Diagnosis(stage, case, "end-to-end", None)
    bound = np.full(base.shape, max(model.spread(stage), model.precision.tiny))
    tol = end_to_end_tolerance(model.kind(stage), "float32")
    fits = []
    for bug in ATTENTION_CLASSES:
        with np.errstate(over="ignore", invalid="ignore"):
            P = bug.attention(o["attn.q"], o["attn.k"], model._mask, model.options)
            alt = P if stage == "attn.weights" else attend_and_project(P, o["attn.v"], model._s, "proj", QUIET)[0]
        fits.append(_fit(port, base, alt, bound, _scaled(bound, alt, base), tol, bug.name))
    return _verdict(stage, case, "end-to-end", fits)


def diagnose_gradient(result, got: Mapping, model, case: str = "") -> Diagnosis:
    """The first divergent cotangent or parameter gradient (``GradResult``) against the gradient
    classes, weighted by the reference's propagated spread there (end to end)."""
    kind, name = result.kind, result.name
    if kind not in ("taps", "params") or name not in got.get(kind, {}):
        return Diagnosis(name, case, "end-to-end", None)
    port = np.asarray(got[kind][name], np.float64)
    base = np.asarray(model.reference[kind][name], np.float64)
    if port.shape != base.shape:
        return Diagnosis(name, case, "end-to-end", None)
    spread = max(model.spread[kind][name], model.floor(kind, name))  # as GradModel.ratio divides by
    bound = np.full(base.shape, max(spread, 1e-300))
    fits = [
        _fit(port, base, np.asarray(bug.gradient(model, kind, name), np.float64), bound, bound, result.tol, bug.name)
        for bug in GRADIENT_CLASSES
        if kind in bug.kinds
    ]
    return _verdict(name, case, "end-to-end", fits)


def _upstream(stage: str, model: CaseModel) -> list[str]:
    """The stage kinds up to ``stage``, the nearest first."""
    names = model.names[: model.names.index(stage) + 1]
    return list(dict.fromkeys(model.kind(n) for n in reversed(names)))


def _fit(port, base, alt, bound, alt_bound, tol, name) -> Fit | None:
    if np.shape(alt) != np.shape(base):
        return None  # not this stage's computation (a class of another stage's shape)
    bad = ~np.isfinite(port)
    if bad.any():  # matched by where, not by how much
        alt_bad = ~np.isfinite(alt)
        both = int((bad & alt_bad).sum())
        # nowhere the port is finite, and most of where it is not (overflow near the dtype's limit
        # depends on the port's order of summation)
        named = both > 0 and not (alt_bad & ~bad).any() and both >= COVERED * bad.sum()
        return Fit(
            name, None, both / float(bad.sum()), float("inf"), bool(named), distance=1.0 - both / float(bad.sum())
        )
    if not np.isfinite(alt).all():
        return None  # the class overflows where the port does not: not this class
    e, d = (port - base) / bound, (alt - base) / bound
    dd = float(np.sum(d * d))
    if dd == 0.0:
        return None  # the class computes the same here: it cannot be told apart
    alpha = float(np.sum(e * d)) / dd
    scatter = e - alpha * d
    se = float(np.sqrt(np.mean(scatter * scatter) / dd))
    scale = np.maximum(bound, alt_bound) * max(tol, 1e-30)
    residual = float(np.max(np.abs(port - base - alpha * (alt - base)) / scale))
    distance = float(np.max(np.abs(port - alt) / scale))
    named = se <= RESOLVED and abs(alpha - 1.0) <= SIGMAS * se + FLOOR and residual <= 1.0
    return Fit(name, alpha, se, residual, named, distance=distance)
