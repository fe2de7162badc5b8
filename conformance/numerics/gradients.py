"""Backward conformance: a port's gradients of a scalar loss against the float64 reference,
tap by tap in backward order and parameter by parameter, and the images'.

The reference is the oracle's own forward (impls/numpy_vit.py) differentiated in float64 by
reverse mode (``numpy_vit.make_grad``), checked against central finite differences of the
plain NumPy oracle (conformance/tests/test_gradients.py). Each tap's cotangent dL/d(stage
output) is the gradient of a zero added there (impls.Perturbed).

**The bound propagates rounding, as the forward's end-to-end check does** (``GradModel``):
the reference's forward and backward are run again, in float64, with

* every forward stage perturbed by Gaussian noise of its unit bound from the forward's error
  model (conformance/numerics/error_model.py: a LayerNorm of a token whose mean is large against its
  spread, a softmax over large logits get large bounds), so a gradient that depends on an
  ill-conditioned activation inherits its uncertainty; and
* every tap's cotangent perturbed by noise of its own rounding, ``u_c √K rms + u_s |g|`` with
  K the length of the backward contraction that produces it (the consumer's: 3D into a
  LayerNorm's output through qkv, N keys into q, head_dim into the attention weights) and rms
  over the row; a parameter's gradient, a sum over the batch's tokens, then carries the sum's
  √(BN) growth of that noise; and
* every softmax's backward P (g − Σ P g) perturbed by its rounding, u_c (|P g| + P (√N |P g|₂
  + |Σ P g|)): where P is nearly one-hot (logits in the thousands) the difference is exactly
  tiny and a float32 port's is its rounding, which no perturbation of g or P reproduces.

A tensor's **ratio** is max|port − reference| / max|noisy − reference| over the runs (never
below the dtype's roundoff of its module's largest gradient: a gradient zero in exact
arithmetic is judged against its module); its tolerance is ``MARGIN`` times the largest ratio
measured on the correct ports (``python -m conformance calibrate --grad``, kept in
conformance/numerics/grad_calibration.json), for taps, parameters and images apart. A divergence is
located at the first tap or parameter outside its tolerance in backward order: the logits'
cotangent first, then each stage's output cotangent followed by the parameters that stage
uses, back to the patch embedding and the images.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache, partial
from pathlib import Path

import numpy as np

from conformance.numerics.precision import UNIT_ROUNDOFF
from impls.stages import cotangent_length, param_stage  # noqa: F401 - param_stage re-exported
from conformance.numerics.tolerances import MARGIN  # the same margin over the calibrated maximum as the forward's
from impls import Loss, Perturbed

CALIBRATION = Path(__file__).with_name("grad_calibration.json")
KINDS = ("taps", "params", "images")
GRAD_DTYPES = ("float32", "bfloat16")


def check_grad_dtype(dtype: str) -> None:
    if dtype == "float16":
        raise ValueError(
            "float16 gradients are not checked: without loss scaling small cotangents underflow "
            "(float16's smallest normal is 6.1e-5), and all three ports agree with one another and not "
            "with the reference there (measured: 169 times the spread at a key's cotangent); bfloat16 "
            "keeps float32's range"
        )
    if dtype not in GRAD_DTYPES:
        raise ValueError(f"gradients are calibrated in {' and '.join(GRAD_DTYPES)}, not {dtype}")


def grad_tolerance(dtype: str = "float32", of: str = "params") -> float:
    """MARGIN x the largest ratio calibrated on correct ports in ``dtype``, for taps, params or
    images."""
    check_grad_dtype(dtype)
    return MARGIN * _calibration()[dtype]["largest_ratio"][of]


@lru_cache(maxsize=1)
def _calibration() -> dict:
    return json.loads(CALIBRATION.read_text())


@dataclass
class GradResult:
    name: str  # a tap, a canonical parameter key, "images" or "loss"
    kind: str  # "taps", "params", "images" or "loss"
    stage: str  # the stage the tap or parameter belongs to
    error: float  # max |port - ref| / max |noisy - ref|
    tol: float
    ok: bool
    reason: str = ""

    @property
    def separation(self) -> float:
        """The error over the tolerance (> 1: outside)."""
        return self.error / max(self.tol, 1e-300)


def module_scales(grads: dict[str, np.ndarray]) -> dict[str, float]:
    """Each tensor's scale: the largest |gradient| among its module's tensors (pos_embed,
    cls_token and the other top-level tensors are their own module)."""
    by_module: dict[str, float] = {}
    for key, g in grads.items():
        module = key.rsplit(".", 1)[0] if "." in key else key
        by_module[module] = max(by_module.get(module, 0.0), float(np.max(np.abs(g))) if g.size else 0.0)
    return {key: by_module[key.rsplit(".", 1)[0] if "." in key else key] for key in grads}


# ----------------------------------------------------------------------------- stages


def backward_order(taps: list[str], params) -> list[tuple[str, str, str]]:
    """(kind, name, stage) from the logits back to the images: each tap's cotangent, then the
    parameters its stage uses."""
    by_stage: dict[str, list[str]] = {}
    for key in params:
        by_stage.setdefault(param_stage(key), []).append(key)
    order = []
    for tap in reversed(taps):
        order.append(("taps", tap, tap))
        order += [("params", key, tap) for key in by_stage.pop(tap, [])]
    order += [("params", key, stage) for stage, keys in by_stage.items() for key in keys]  # a stage not tapped
    return order + [("images", "images", "images")]


# ----------------------------------------------------------------------------- the error model


@lru_cache(maxsize=1)
def _rounded():
    """identity(x) whose vector-Jacobian product adds ``noise`` times the cotangent's rounding."""
    from autograd.extend import defvjp, primitive

    @primitive
    def rounded(x, noise, length, u_c, u_s):
        return x

    def vjp(ans, x, noise, length, u_c, u_s):
        def add_rounding(g):
            rms = np.sqrt(np.mean(g * g, axis=-1, keepdims=True))
            return g + noise * (u_c * math.sqrt(length) * rms + u_s * np.abs(g))

        return add_rounding

    defvjp(rounded, vjp)
    return rounded


@lru_cache(maxsize=1)
def _noisy_oracle():
    """A second copy of the traced oracle whose softmax's backward adds noise of its own
    rounding (``module.rounding = (rng, u_c)`` per run). The softmax backward P (g - sum P g)
    cancels where P is nearly one-hot (logits in the thousands): the difference is exactly
    tiny, a float32 port's is its rounding, u |P g|, and no perturbation of g or P reproduces
    that (both cancel the same way)."""
    from autograd.extend import defvjp, primitive

    from impls import numpy_vit

    module = numpy_vit._traced("impls._numpy_vit_noisy")
    clean = module.softmax

    @primitive
    def softmax(x, axis=-1):
        return clean(x, axis)

    def vjp(P, x, axis=-1):
        def back(g):
            Pg = P * g
            s = np.sum(Pg, axis, keepdims=True)
            rng, u = module.rounding
            n = x.shape[axis]
            bound = u * (np.abs(Pg) + P * (math.sqrt(n) * np.sqrt(np.sum(Pg * Pg, axis, keepdims=True)) + np.abs(s)))
            return Pg - P * s + rng.standard_normal(P.shape) * bound

        return back

    defvjp(softmax, vjp)
    module.softmax = softmax
    return module


class _Rounding(Perturbed):
    """The reference's taps in a noisy run: forward noise added to each stage output, and the
    cotangent reaching it perturbed by its rounding."""

    def __init__(self, zeros, forward, backward, lengths, u_c, u_s):
        super().__init__(zeros)
        self.forward, self.backward, self.lengths, self.u = forward, backward, lengths, (u_c, u_s)

    def perturb(self, name, value):
        value = super().perturb(name, value) + self.forward[name]
        return _rounded()(value, self.backward[name], self.lengths[name], *self.u)


class GradModel:
    """The reference gradient of one case (config, state, images, loss) and the spread of a
    correct port's rounding around it, per tap, parameter and the images."""

    def __init__(
        self, config, state, images, loss: Loss, dtype: str = "float32", runs: int | None = None, seed: int = 0
    ):
        from conformance.numerics.error_model import CaseModel, Precision
        from impls import numpy_vit

        self.config, self.images, self.loss, self.dtype = config, np.asarray(images), loss, dtype
        self.state = state  # what a bug class's reference is taken on (conformance.diagnosis)
        self.precision = Precision(dtype)
        self.seed = seed
        self.reference = numpy_vit.make_grad(config, state)(self.images, loss)
        self._noisy = _noisy_oracle()
        self._grad = numpy_vit.make_grad(config, state, model_cls=self._noisy.VisionTransformer)
        self._forward = CaseModel(config, state, images, self.precision)
        self.scales = module_scales(self.reference["params"])
        # As the forward's spread: 8 runs on small models, so that a tensor of a few entries (a
        # bias, the loss) is not judged by the luck of few draws; 3 on full-size ones.
        elements = sum(g.size for g in self.reference["params"].values())
        elements += sum(g.size for g in self.reference["taps"].values())
        self.runs = runs or (8 if elements < 2e5 else 3)

    @cached_property
    def spread(self) -> dict:
        """max |noisy − reference| per tensor over the runs: {"taps": {...}, "params": {...},
        "images": float, "loss": float}."""
        oracle = self._forward.oracle
        bounds = {name: self._forward.evaluate(name, oracle)[1] for name in self.reference["taps"]}
        tokens = self.config.at_img_size(self.images.shape[-2:]).num_tokens
        lengths = {name: cotangent_length(name, self.config, tokens) for name in bounds}
        u_c, u_s = self.precision.compute, self.precision.storage
        rng = np.random.default_rng(self.seed)
        self._noisy.rounding = (rng, u_c)
        ref = self.reference
        out = {
            "taps": dict.fromkeys(ref["taps"], 0.0),
            "params": dict.fromkeys(ref["params"], 0.0),
            "images": 0.0,
            "loss": 0.0,
        }
        for _ in range(self.runs):
            forward = {k: rng.standard_normal(b.shape) * b for k, b in bounds.items()}
            backward = {k: rng.standard_normal(b.shape) for k, b in bounds.items()}
            noisy = self._grad(
                self.images,
                self.loss,
                perturbed=partial(_Rounding, forward=forward, backward=backward, lengths=lengths, u_c=u_c, u_s=u_s),
            )
            for of in ("taps", "params"):
                for k, r in ref[of].items():
                    out[of][k] = max(out[of][k], float(np.max(np.abs(noisy[of][k] - r), initial=0.0)))
            out["images"] = max(out["images"], float(np.max(np.abs(noisy["images"] - ref["images"]))))
            out["loss"] = max(out["loss"], abs(noisy["loss"] - ref["loss"]))
        return out

    def beyond_range(self) -> str | None:
        """Why no port can represent this case in its dtype (the forward's check), or None."""
        return self._forward.beyond_range()

    def settle(self) -> None:
        """Nothing to run: the forward's check was complete before the port ran."""

    def floor(self, kind: str, name: str) -> float:
        """The dtype's roundoff of the tensor's scale (its module's, for a parameter)."""
        u = self.precision.storage
        if kind == "params":
            return u * self.scales[name]
        ref = self.reference["taps"][name] if kind == "taps" else self.reference[kind]
        return u * max(float(np.max(np.abs(ref), initial=0.0)), 1.0 if kind == "loss" else 0.0)

    def ratio(self, kind: str, name: str, got) -> float:
        ref = self.reference[kind][name] if kind in ("taps", "params") else self.reference[kind]
        spread = self.spread[kind][name] if kind in ("taps", "params") else self.spread[kind]
        diff = float(np.max(np.abs(np.asarray(got, np.float64) - ref), initial=0.0))
        denominator = max(spread, self.floor(kind, name))
        return diff / denominator if denominator else (0.0 if diff == 0.0 else np.inf)

    def delta(self, key: str) -> float:
        """How far a correct port's gradient of parameter ``key`` may be: the tolerance times
        its spread (for the AdamW step's bound)."""
        return grad_tolerance(self.dtype, "params") * max(self.spread["params"][key], self.floor("params", key))


def compare_gradients(got: dict, model: GradModel) -> list[GradResult]:
    """Every tap's cotangent the port returns and every parameter's gradient in backward order,
    then the images' and the loss."""
    ref, dtype = model.reference, model.dtype
    results = []
    missing = sorted(set(ref["params"]) - set(got["params"]))
    extra = sorted(set(got["params"]) - set(ref["params"]))
    if missing or extra:
        results.append(GradResult("params", "params", "", np.inf, 0.0, False, f"missing {missing}, unexpected {extra}"))
    taps = got.get("taps") or {}
    for kind, name, stage in backward_order(list(ref["taps"]), ref["params"]):
        if kind == "taps" and name not in taps:
            continue  # a port that does not return this tap's cotangent is judged on the rest
        value = got[kind] if kind == "images" else (taps if kind == "taps" else got["params"]).get(name)
        if value is None:
            continue
        expected = ref[kind] if kind == "images" else ref[kind][name]
        tol = grad_tolerance(dtype, kind)
        if np.shape(value) != expected.shape:
            results.append(
                GradResult(name, kind, stage, np.inf, tol, False, f"shape {np.shape(value)}, expected {expected.shape}")
            )
            continue
        e = model.ratio(kind, name, value)
        results.append(
            GradResult(
                name,
                kind,
                stage,
                e,
                tol,
                bool(e <= tol),
                "" if e <= tol else f"{e:.3g} times its propagated rounding, over the tolerance {tol:.3g}",
            )
        )
    diff = abs(got["loss"] - ref["loss"])
    e = diff / max(model.spread["loss"], model.floor("loss", "loss"))
    tol = grad_tolerance(dtype, "taps")
    results.append(GradResult("loss", "loss", "loss", e, tol, bool(e <= tol)))
    return results


def first_failure(results: list[GradResult]) -> GradResult | None:
    """The first gradient outside its tolerance in backward order (compare_gradients' order)."""
    return next((r for r in results if not r.ok and r.kind != "loss"), next((r for r in results if not r.ok), None))


def describe(results: list[GradResult], limit: int = 5) -> str:
    bad = [r for r in results if not r.ok]
    lines = [f"{len(bad)} of {len(results)} gradients outside their tolerance (backward order):"]
    lines += [
        f"  {r.kind[:-1] if r.kind in ('taps', 'params') else r.kind} {r.name}: "
        f"{r.reason or f'{r.error:.3g} > {r.tol:.3g}'}"
        for r in bad[:limit]
    ]
    return "\n".join(lines + ([f"  ... and {len(bad) - limit} more"] if len(bad) > limit else []))


def step_bound(state: dict, model: GradModel, hp) -> dict[str, np.ndarray]:
    """Per entry, how far a correct port's parameter may be from the reference after one AdamW
    step from zero moments, derived from the gradient bound (no calibration of its own).

    The step is p (1 - lr wd) - lr u(g) with u(g) = g / (|g| + eps) (bias-corrected first
    moments). A port's gradient is within delta (``GradModel.delta``: its tolerance times its
    propagated rounding) of the reference's, and u is increasing, so its update is within lr max(u(g + delta) - u(g),
    u(g) - u(g - delta)). Where |g| is near or below delta (a gradient zero in exact arithmetic)
    that is up to 2 lr: the step is undetermined there, for any port. Added: the dtype's
    rounding of the update (8 u lr) and of the decayed parameter (4 u |p|), and the bias
    corrections 1 - beta^t evaluated in the dtype, as optax and MLX do (torch in float64):
    beta rounds by u beta, so 1 - beta^t is off by t u beta / (1 - beta^t) relatively, 1000 u
    for beta2 = 0.999 at t = 1 (measured: the update 6.6e-6 low in both), entering the update
    halved through the square root for beta2 and whole for beta1."""
    u = UNIT_ROUNDOFF[model.dtype]
    (b1, b2), t = hp.betas, 1
    bias = u * (0.5 * t * b2 / (1 - b2**t) + t * b1 / (1 - b1**t))

    def update(x):
        return x / (np.abs(x) + hp.eps)

    bounds = {}
    for key, g in model.reference["params"].items():
        delta = model.delta(key)
        spread = np.maximum(update(g + delta) - update(g), update(g) - update(g - delta))
        bounds[key] = hp.lr * (spread + 8 * u + bias) + 4 * u * np.abs(np.asarray(state[key], np.float64))
    return bounds


def compare_step(got: dict, ref: dict, bounds: dict) -> list[GradResult]:
    """Each parameter after the step: the largest |port - reference| over its entry's bound."""
    results = []
    for key, r in ref.items():
        ratio = float(np.max(np.abs(np.asarray(got[key], np.float64) - r) / bounds[key]))
        results.append(
            GradResult(
                key,
                "params",
                "",
                ratio,
                1.0,
                ratio <= 1.0,
                "" if ratio <= 1.0 else f"{ratio:.3g} times its entries' bound after one step",
            )
        )
    return results


def draw_loss(config, batch: int, kind: str, seed: int) -> Loss:
    rng = np.random.default_rng(seed)
    if kind == "cross_entropy" and config.num_classes > 1:  # over one class it is identically 0
        return Loss(kind, labels=rng.integers(0, config.num_classes, batch))
    # a headless model's (a tower's) output is its pooled features: a linear functional of those
    return Loss("linear", weights=rng.standard_normal((batch, config.num_features)))
