"""Compare a port's outputs with the float64 oracle, stage by stage.

A port's misbehaviour (a missing or mis-shaped tap, NaN, a wrong dtype) is a finding with a
one-line reason, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from conformance.tolerances import tolerance
from impls.config import ViTConfig, tap_names, tap_shapes

_BLOCK = re.compile(r"^blocks\.\d+(\.|$)")


def stage_kind(name: str) -> str:
    """'blocks.3.attn.q' -> 'attn.q', 'blocks.3' -> 'block', 'logits' -> 'logits'."""
    if _BLOCK.match(name):
        rest = name.split(".", 2)[2:]
        return rest[0] if rest else "block"
    return name


@dataclass
class StageResult:
    name: str
    max_abs_err: float | None
    rel_err: float | None
    tol: float | None
    ok: bool
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs error, max abs error over the largest |expected|)."""
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    return max_abs, max_abs / max(scale, np.finfo(np.float64).tiny)


def compare_array(name: str, actual, expected: np.ndarray, tol: float, shape=None) -> StageResult:
    shape = expected.shape if shape is None else shape
    if not isinstance(actual, np.ndarray):
        try:
            actual = np.asarray(actual)
        except Exception as e:  # a port may return anything
            return StageResult(name, None, None, tol, False, f"output is not an array: {type(actual).__name__} ({e})")
    if tuple(actual.shape) != tuple(shape):
        return StageResult(name, None, None, tol, False, f"shape {tuple(actual.shape)}, expected {tuple(shape)}")
    if not np.issubdtype(actual.dtype, np.floating):
        return StageResult(name, None, None, tol, False, f"dtype {actual.dtype}, expected a float dtype")
    finite = np.isfinite(actual)
    if not finite.all():
        n_nan, n_inf = int(np.isnan(actual).sum()), int(np.isinf(actual).sum())
        return StageResult(name, float("inf"), float("inf"), tol, False, f"non-finite values: {n_nan} NaN, {n_inf} Inf")
    max_abs, rel = error(actual, expected)
    ok = rel <= tol
    return StageResult(name, max_abs, rel, tol, ok, "" if ok else f"rel_err {rel:.3g} > tol {tol:.3g}")


def compare_outputs(out, oracle: Mapping[str, np.ndarray], config: ViTConfig, *, batch: int,
                    dtype: str = "float32", regime: str = "normal") -> list[StageResult]:
    """Every stage the port emitted, in model order, against the oracle's taps.

    ``out`` is what a port's forward returned: the logits, or a dict with "logits" and taps.
    """
    shapes = tap_shapes(config, batch)
    if not isinstance(out, Mapping):
        out = {"logits": out}
    results = []
    for name in tap_names(config):
        tol = tolerance(stage_kind(name), dtype, regime)
        if name not in out:
            if name == "logits":
                results.append(StageResult(name, None, None, tol, False, "the port returned no 'logits'"))
            continue
        results.append(compare_array(name, out[name], oracle[name], tol, shapes[name]))
    return results


def first_divergence(results: list[StageResult]) -> str | None:
    return next((r.name for r in results if not r.ok), None)


def describe_failures(results: list[StageResult], port: str, **context) -> str:
    """A report naming the port, each failing stage with its errors, and the drawn case."""
    lines = [f"port {port!r} diverges from the float64 oracle; first divergent stage: {first_divergence(results)}"]
    for r in results:
        if not r.ok:
            if r.max_abs_err is None:
                lines.append(f"  {r.name}: {r.reason}")
            else:
                lines.append(f"  {r.name}: max_abs_err {r.max_abs_err:.3e}, rel_err {r.rel_err:.3e} > tol {r.tol:.3e}"
                             + (f" ({r.reason})" if r.reason and "rel_err" not in r.reason else ""))
    for key, value in context.items():
        lines.append(f"  {key}: {value}")
    return "\n".join(lines)
