"""Compare a port's outputs with the float64 oracle, stage by stage, through the error model.

Every stage the port emits is judged twice: **locally** (the oracle's stage computed from the
port's own inputs to it, so one operation is judged at a time) where the port emits those
inputs, and **end to end** (against the oracle run from the images) with a bound that
propagates. A port's misbehaviour (a missing or mis-shaped tap, NaN, a wrong dtype) is a
finding with a one-line reason, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from conformance.error_model import DTYPES, CaseModel, Chain, stage_kind  # noqa: F401 - stage_kind re-exported
from conformance.tolerances import tolerance
from impls.config import ViTConfig, tap_names, tap_shapes

_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}  # significand bits


@dataclass
class StageResult:
    name: str
    max_abs_err: float | None
    rel_err: float | None  # max|port - oracle| / max|oracle|: for reading, not for the verdict
    ratio: float | None  # error over the error model's bound (local where the inputs were emitted)
    tol: float | None
    ok: bool
    reason: str = ""
    mode: str = "local"
    e2e_ratio: float | None = None  # max|port - oracle| / max|noisy oracle - oracle|
    e2e_tol: float | None = None

    @property
    def separation(self) -> float:
        """How far over (> 1) or under its tolerance the stage is, the worse of both checks."""
        if self.ratio is None:
            return float("inf")
        worst = self.ratio / self.tol if self.tol else float("inf")
        if self.e2e_ratio is not None and self.e2e_tol:
            worst = max(worst, self.e2e_ratio / self.e2e_tol)
        return worst

    def to_dict(self) -> dict:
        return asdict(self)


def error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs error, max abs error over the largest |expected|)."""
    diff = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(expected).max()) if np.size(expected) else 0.0
    return max_abs, max_abs / max(scale, np.finfo(np.float64).tiny)


def _dtype_name(a) -> str:
    return str(getattr(a, "dtype", type(a).__name__)).rsplit(".", 1)[-1]


def malformed(actual, shape, dtype: str = "float32") -> str | None:
    """Why ``actual`` cannot be a stage in ``dtype`` of this shape, or None."""
    if not isinstance(actual, np.ndarray):
        try:
            actual = np.asarray(actual)
        except Exception as e:  # a port may return anything
            return f"output is not an array: {type(actual).__name__} ({e})"
    if tuple(actual.shape) != tuple(shape):
        return f"shape {tuple(actual.shape)}, expected {tuple(shape)}"
    got = _dtype_name(actual)
    if got not in _BITS:
        return f"dtype {got}, expected {dtype}"
    if got != dtype:
        if _BITS[got] < _BITS[dtype]:
            return f"dtype {got}: lower precision than the {dtype} asked for"
        if dtype == "float32" or got == "float64":
            return f"dtype {got}, asked for {dtype}: a wider type hides the {dtype} rounding being checked"
        # bf16/fp16 returned as float32 (NumPy has no bfloat16): the values must be that dtype's.
        import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy

        finite = actual[np.isfinite(actual)]
        if not np.array_equal(finite.astype(dtype).astype(np.float32), finite):
            return f"values carry more than {dtype} precision: the port did not compute in {dtype}"
    if not np.isfinite(np.asarray(actual, np.float64)).all():
        a = np.asarray(actual, np.float64)
        return f"non-finite values: {int(np.isnan(a).sum())} NaN, {int(np.isinf(a).sum())} Inf"
    return None


def ratio_over_bound(err: np.ndarray, bound) -> float:
    """max over elements of err / bound (0 where err is 0): the error model's ratio."""
    err = np.asarray(err, np.float64)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    return float(np.max(np.divide(err, bound, out=np.zeros_like(err), where=err > 0), initial=0.0))


def stage_ratios(name: str, actual, model: Chain, taps: Mapping, local: bool = True) -> dict:
    """The error of a well-formed stage: max abs and relative error against the oracle, the
    end-to-end ratio (over the propagated spread) and, if ``local``, the local ratio (over the
    unit bound of the stage computed from the port's own inputs)."""
    a = np.asarray(actual, np.float64)
    max_abs, rel = error(a, model.oracle[name])
    spread = model.spread(name)
    e2e = max_abs / spread if spread > 0 else (0.0 if max_abs == 0 else float("inf"))
    out = {"max_abs_err": max_abs, "rel_err": rel, "end-to-end": e2e}
    if local:
        value, bound = model.local(name, taps)
        out["local"] = ratio_over_bound(np.abs(a - value), bound + model.precision.tiny)
    return out


def compare_stage(name: str, actual, model: Chain, taps: Mapping, *, dtype: str = "float32",
                  shape=None, valid: set | None = None) -> StageResult:
    """One emitted stage against the error model. ``valid``: the taps that are well-formed."""
    kind = model.kind(name)
    shape = model.oracle[name].shape if shape is None else shape
    reason = None if valid is not None and name in valid else malformed(actual, shape, dtype)
    local = model.can_check_locally(name, valid if valid is not None else taps)
    mode = "local" if local else "end-to-end"
    tol = tolerance(kind, dtype, mode)
    if reason:
        bad = float("inf") if reason.startswith("non-finite") else None
        return StageResult(name, bad, bad, bad, tol, False, reason, mode)
    r = stage_ratios(name, actual, model, taps, local)
    ratio, e2e, e2e_tol = r[mode], r["end-to-end"], tolerance(kind, dtype, "end-to-end")
    ok = ratio <= tol and e2e <= e2e_tol
    why = ""
    if not ok:
        why = (f"error {ratio:.3g}x its bound > tol {tol:.3g} ({'local' if local else 'end to end'})" if ratio > tol
               else f"end to end: error {e2e:.3g}x the propagated bound > tol {e2e_tol:.3g}")
    return StageResult(name, r["max_abs_err"], r["rel_err"], ratio, tol, ok, why, mode, e2e, e2e_tol)


def compare_outputs(out, model: CaseModel, *, batch: int | None = None, dtype: str = "float32") -> list[StageResult]:
    """Every stage the port emitted, in model order, against the error model of its case.

    ``out`` is what a port's forward returned: the logits, or a dict with "logits" and taps.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config: ViTConfig = model.config
    shapes = tap_shapes(config, model.images.shape[0] if batch is None else batch, model.images.shape[2:])
    if not isinstance(out, Mapping):
        out = {"logits": out}
    names = [n for n in tap_names(config) if n in out]
    valid = {n for n in names if malformed(out[n], shapes[n], dtype) is None}
    results = [compare_stage(n, out[n], model, out, dtype=dtype, shape=shapes[n], valid=valid) for n in names]
    if "logits" not in out and "logits" not in getattr(out, "unseen", {}):
        results.append(StageResult("logits", None, None, None, tolerance("logits", dtype, "end-to-end"), False,
                                   "the port returned no 'logits'", "end-to-end"))
    return results


def first_divergence(results: list[StageResult]) -> str | None:
    return next((r.name for r in results if not r.ok), None)


def describe_failures(results: list[StageResult], port: str, **context) -> str:
    """A report naming the port, each failing stage (at most 8) with its errors, and the drawn case."""
    failing = [r for r in results if not r.ok]
    lines = [f"port {port!r} diverges from the float64 oracle; first divergent stage: {first_divergence(results)}"]
    for r in failing[:8]:
        if r.max_abs_err is None or r.ratio is None or not np.isfinite(r.ratio):
            lines.append(f"  {r.name}: {r.reason}")
        else:
            lines.append(f"  {r.name}: max_abs_err {r.max_abs_err:.3e}, rel_err {r.rel_err:.3e}; {r.reason}")
    if len(failing) > 8:
        lines.append(f"  ... and {len(failing) - 8} later stages")
    for key, value in context.items():
        lines.append(f"  {key}: {value}")
    return "\n".join(lines)
