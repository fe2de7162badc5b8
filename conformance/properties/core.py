"""What every property shares: the cases, the failure, building and running a port, and the
comparisons against the oracle within the error model's bounds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from conformance.guard import process_state
from conformance.numerics import error_model as E
from conformance.numerics.compare import compare_stage, ratio_over_bound, relative_spread
from conformance.numerics.tolerances import end_to_end_tolerance, tolerance
from conformance.report import CannotJudge, ToolError, describe_exception
from conformance.returned import Taps, as_taps
from conformance.support import Unsupported, build
from impls.protocol import ViTConfig


class PropertyFailure(AssertionError):
    """A port violates a property; the message says where, ``stage`` names the stage if one."""

    stage: str | None = None

    def __init__(self, message: str = "", stage: str | None = None):
        super().__init__(message)
        self.stage = stage


class NotApplicable(Exception):
    """The property needs a tap the port does not emit."""


@dataclass
class ModelCase:
    config: ViTConfig
    state: dict[str, np.ndarray] = field(repr=False)
    images: np.ndarray = field(repr=False)
    info: dict = field(default_factory=dict)  # how it was drawn, for messages
    dtype: str = "float32"  # what the port is asked to compute in

    def describe(self) -> dict:
        return {
            "config": self.config,
            **self.info,
            **({"dtype": self.dtype} if self.dtype != "float32" else {}),
            "images": f"{self.images.shape} {self.info.get('images', '')}".strip(),
        }

    def __repr__(self) -> str:  # what hypothesis prints for a failing example: no state dict
        return f"ModelCase({', '.join(f'{k}={v}' for k, v in self.describe().items())})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def error_model(self, images=None, state=None) -> E.CaseModel:
        """The error model of this case (or of its images or state replaced), built once."""
        if images is None and state is None:
            if getattr(self, "_model", None) is None:
                self._model = E.CaseModel(self.config, self.state, self.images, self.dtype)
            return self._model
        return E.CaseModel(
            self.config, self.state if state is None else state, self.images if images is None else images, self.dtype
        )


@dataclass
class AttentionCase:
    """A standalone attention: its constructor options, canonical state and inputs."""

    options: dict  # dim, context_dim, num_heads, head_dim, qkv_bias
    state: dict[str, np.ndarray] = field(repr=False)
    x: np.ndarray = field(repr=False)
    context: np.ndarray | None = field(repr=False)
    info: dict = field(default_factory=dict)
    dtype = "float32"  # (not a field) the attention properties run in float32

    def describe(self) -> dict:
        return {
            "attention": self.options,
            "x": self.x.shape,
            "context": None if self.context is None else self.context.shape,
            **self.info,
        }

    def __repr__(self) -> str:
        return f"AttentionCase({', '.join(f'{k}={v}' for k, v in self.describe().items())})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def error_model(self, x=None, context="same", mask=None, state=None) -> E.AttentionModel:
        ctx = self.context if isinstance(context, str) else context
        return E.AttentionModel(
            self.options, self.state if state is None else state, self.x if x is None else x, ctx, mask
        )


def _fail(port: str, what: str, case, **details) -> PropertyFailure:
    lines = [f"[{port}] {what}"]
    lines += [f"  {k}: {v}" for k, v in details.items()]
    lines += [f"  {k}: {v}" for k, v in case.describe().items()]
    return PropertyFailure("\n".join(lines), stage=details.get("stage"))


def _call(port: str, fn: Callable, *args, case=None):
    """Run a port; an exception or a malformed result is a finding, not a crash."""
    from hypothesis import currently_in_test_context, reject
    from hypothesis.errors import UnsatisfiedAssumption

    try:
        with process_state():  # numpy's functions, error handling and the working directory kept
            return fn(*args)
    except Unsupported:
        # a drawn config the port refuses as it builds (a combination its declaration cannot say):
        # discarded, the property goes on with the next; a fixed one is reported as such
        if currently_in_test_context():
            reject()
        raise
    except (UnsatisfiedAssumption, ToolError, CannotJudge):
        # discarded (hypothesis); the tool's own failure; a model the tool cannot judge (the
        # plugin's usage error)
        raise
    except SystemExit as e:
        raise _fail(port, f"the port exited (sys.exit({e.code!r})) before returning", case) from e
    except Exception as e:  # noqa: BLE001 - anything a port raises is reported
        raise _fail(port, f"the port raised {describe_exception(e)}", case) from e


def check_fully_masked_row(port: str, out, weights, row: int, proj_bias) -> None:
    """A query that may attend to no key: finite output equal to proj's bias (a zero attention
    output), and zero weights."""
    out = np.asarray(out)
    if not np.isfinite(out).all():
        raise PropertyFailure(
            f"port {port!r}: a fully masked query row gives non-finite output ({int(np.isnan(out).sum())} NaN)",
            stage="attn",
        )
    got = out[:, row]
    if not np.array_equal(got, np.broadcast_to(proj_bias, got.shape)):
        raise PropertyFailure(
            f"port {port!r}: fully masked query row {row} is not proj's bias (a zero attention "
            f"output): max |out - bias| = {np.abs(got - proj_bias).max():.3g}",
            stage="attn",
        )
    if weights is not None and np.any(np.asarray(weights)[:, :, row] != 0):
        raise PropertyFailure(
            f"port {port!r}: fully masked query row {row} should get zero weights, got row sums "
            f"{np.asarray(weights)[:, :, row].sum(-1).ravel()[:4]}",
            stage="attn.weights",
        )


def run_model(port: str, make: Callable, case: ModelCase, images=None, state=None) -> dict:
    """Build and run a port; return its outputs as a dict with at least 'logits'."""
    forward = _call(port, build, make, case.config, case.state if state is None else state, case.dtype, case=case)
    out = _call(port, forward, case.images if images is None else images, case=case)
    if not isinstance(out, Mapping):
        out = {"logits": out}
    if "logits" not in out and "logits" not in as_taps(out).unseen:
        raise _fail(port, "the port returned no 'logits'", case, returned=sorted(out))
    return out if isinstance(out, Taps) else dict(out)  # a captured model's Taps keep what was unseen


def _needs(out: Mapping, *names: str) -> None:
    missing = [n for n in names if n not in out]
    found = {stage: why for stage, why in as_taps(out).findings if stage in missing}
    if found:  # a model port that could not produce the stage: its module never ran
        stage, why = next(iter(found.items()))
        raise PropertyFailure(f"{stage}: {why}", stage=stage)
    if missing:
        raise NotApplicable(f"needs taps {missing}")


class _Arrays:
    """A case that is only arrays (no drawn config), for messages."""

    def __init__(self, **shapes):
        self.shapes = shapes

    def describe(self) -> dict:
        return self.shapes


def check_close(
    port: str,
    what: str,
    actual,
    expected,
    bound,
    kind: str,
    *,
    pair: bool = False,
    mode: str = "local",
    dtype: str = "float32",
    case=None,
    stage: str | None = None,
) -> None:
    """|actual - expected| within ``tolerance(kind, dtype, mode)`` times ``bound``: the error
    model's per-element unit bound (local) or its propagated spread, a number (end to end).
    ``pair``: both are outputs of ports, each within the tolerance of the truth, so twice it."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    case = _Arrays(shape=e.shape) if case is None else case
    if a.shape != e.shape:
        raise _fail(port, what, case, stage=stage or kind, error=f"shape {a.shape}, expected {e.shape}")
    if not np.isfinite(a).all():
        raise _fail(port, what, case, stage=stage or kind, error=f"{int((~np.isfinite(a)).sum())} non-finite values")
    if mode == "end-to-end" and np.ndim(bound) == 0:  # a propagated spread: chaotic or not
        tol = end_to_end_tolerance(kind, dtype, relative_spread(float(bound), e))
    else:
        tol = tolerance(kind, dtype, mode)
    tol *= 2.0 if pair else 1.0
    diff = np.abs(a - e)
    ratio = ratio_over_bound(diff, np.asarray(bound, np.float64) + E.SMALLEST_NORMAL[dtype])
    if ratio > tol:
        raise _fail(
            port,
            what,
            case,
            stage=stage or kind,
            error=f"max_abs_err {float(diff.max()):.3e}, error {ratio:.3g}x the {mode} bound > tol {tol:.3g}",
        )


def check_stage(port: str, what: str, actual, expected, errors, stage: str, *, pair=True, case=None) -> None:
    """``actual`` and ``expected``, two computations of ``stage``, agree within the end-to-end bound
    the error model ``errors`` propagates to it (``pair``: both sides carry rounding)."""
    check_close(
        port,
        what,
        actual,
        expected,
        errors.spread(stage),
        errors.kind(stage),
        pair=pair,
        mode="end-to-end",
        dtype="float32" if case is None else case.dtype,
        case=case,
        stage=stage,
    )


def within(port, what, case, name, actual, expected, model=None, pair=True) -> None:
    """Two outputs of a stage agree within the propagated bound of ``model`` (default: the case's)."""
    check_stage(
        port, what, actual, expected, case.error_model() if model is None else model, name, pair=pair, case=case
    )


def local(port, what, case, out, name, model=None) -> None:
    """Stage ``name`` of the port equals the oracle's computed from the port's own inputs to it."""
    model = case.error_model() if model is None else model
    _needs(out, name, *model.inputs(name))
    r = compare_stage(name, out[name], model, out, dtype=case.dtype)
    if r.ratio is None or r.ratio > r.tol:
        raise _fail(port, what, case, stage=name, error=r.reason or f"error {r.ratio:.3g}x its bound > tol {r.tol:.3g}")


def check_sums_to_one_over_keys(port: str, weights, bound, kind: str, **where) -> None:
    """Attention weights (..., Nq, Nk) sum to 1 over the keys, each row within ``bound`` (softmax
    over the key axis; over the queries they do not). ``where``: check_close's keywords."""
    sums = np.asarray(weights, np.float64).sum(-1)
    check_close(port, "attention weights do not sum to 1 over keys", sums, np.ones_like(sums), bound, kind, **where)
