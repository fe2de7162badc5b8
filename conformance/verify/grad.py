"""Verify a gradient factory against the float64 reference, tap by tap in backward order.

    python -m conformance verify --grad pkg.module:make_grad [--preset NAME | --config JSON]
                                 [--weights PATH] [--json PATH]

A gradient factory is ``make_grad(config, state) -> grad(images, loss)`` returning
``{"loss": float, "params": {canonical key: dL/dparam}, "images": dL/dimages, "taps": {tap:
dL/d(stage output)}}`` ("taps" optional: without it a divergence is located at the first
parameter), with ``loss`` an ``impls.Loss`` the port computes with its own framework's ops. The
built-in ports' factories are ``impls.<framework>_vit:make_grad`` (or just the framework's name).
Exit status as verify's: 0 conforms, 1 does not, 2 usage error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from conformance.diagnosis import guarded
from conformance.diagnosis.fit import diagnose_gradient
from conformance.generators import OFFSET, TrainedLike, WeightCase, make_images
from conformance.numerics.gradients import (
    KINDS,
    GradModel,
    GradResult,
    backward_order,
    check_grad_dtype,
    compare_gradients,
    draw_loss,
)
from conformance.report import table
from conformance.sandbox.portside import PortSide, load_grad_factory, port_side  # noqa: F401 - re-exported
from conformance.verify.cases import Case, read_only
from conformance.verify.loop import Outcome, run_cases
from conformance.verify.report import VerifyReport, finding
from impls import tap_names
from impls.protocol import ViTConfig


def grad_cases(config: ViTConfig, state: dict | None = None, seed: int = 0) -> list[tuple[Case, str]]:
    """(case, loss kind): ordinary images in batches of 3 and 1 on the given (or seeded)
    weights, and with seeded weights also weights at 4x, a common offset of 1000 (LayerNorms of
    tokens whose mean is 650 times their spread) and trained-like weights (massive activations,
    attention logits in the thousands: softmax rows nearly one-hot); cross-entropy and a linear
    functional of the logits alternately."""
    base = state if state is not None else WeightCase(seed, 1.0).make(config)
    cases = [
        (Case("batch 3", make_images(config, 3, "ordinary", seed), base), "cross_entropy"),
        (Case("batch 1", make_images(config, 1, "ordinary", seed + 1), base), "linear"),
    ]
    if state is None:
        for i, (w, label) in enumerate(
            (
                (WeightCase(seed + 1, 4.0), "weights x4"),
                (WeightCase(seed + 2, 4.0, OFFSET), "offset 1000"),
                (TrainedLike(seed + 4), "trained-like weights"),
            )
        ):
            batch = (3, 1)[i % 2]
            cases.append(
                (
                    Case(f"batch {batch}, {label}", make_images(config, batch, "ordinary", seed), w.make(config)),
                    ("cross_entropy", "linear")[i % 2],
                )
            )
    return cases


@dataclass
class GradReport(VerifyReport):
    """The gradient check's report: per tensor (tap cotangents, parameters, the images) in
    backward order, the first divergence a tensor."""

    results: list[GradResult] = field(default_factory=list)  # worst case per tensor, backward order
    first_divergence: GradResult | None = None
    first_case: str | None = None
    taps: bool = False  # the port returned tap cotangents

    kind = "gradient"

    def located(self) -> str | None:
        """Where the port first diverges in backward order: the first tap or parameter, or the
        first finding's stage."""
        if self.first_divergence is not None:
            return self.first_divergence.name
        return self.failures[0]["stage"] if self.failures else None

    @property
    def conformant(self) -> bool:
        return not self.failures and bool(self.results) and all(r.ok for r in self.results)

    def separation(self, name: str | None = None) -> float | None:
        """The worst case's error over the tolerance for tap or parameter ``name`` (default: the
        first divergence)."""
        name = name or (self.first_divergence.name if self.first_divergence else None)
        r = next((r for r in self.results if r.name == name), None)
        return None if r is None or not r.tol else r.error / r.tol

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "port": self.port,
            "conformant": self.conformant,
            "dtype": self.dtype,
            "config": self.config.to_dict(),
            "cases": self.cases,
            "skipped": self.skipped,
            "taps": self.taps,
            "failures": self.failures,
            "first_divergence": None
            if first is None
            else {"kind": first.kind, "name": first.name, "stage": first.stage, "case": self.first_case},
            "results": [
                {
                    "kind": r.kind,
                    "name": r.name,
                    "stage": r.stage,
                    "ok": r.ok,
                    "reason": r.reason,
                    "error": r.error if np.isfinite(r.error) else None,
                    "tol": r.tol,
                    "case": self.worst_case.get(r.name),
                }
                for r in self.results
            ],
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
        }


def _structure_problem(out, reference: dict) -> str | None:
    if not isinstance(out, Mapping) or not {"loss", "params", "images"} <= set(out):
        return "grad(images, loss) must return a mapping with 'loss', 'params' and 'images' (and optionally 'taps')"
    arrays = [("images", out["images"])] + [(f"params[{k!r}]", v) for k, v in dict(out["params"]).items()]
    arrays += [(f"taps[{k!r}]", v) for k, v in dict(out.get("taps") or {}).items()]
    unknown = sorted(set(out.get("taps") or {}) - set(reference["taps"]))
    if unknown:
        return f"unknown tap names {unknown[:4]}; the taps are impls.tap_names(config)"
    for name, value in [("loss", out["loss"]), *arrays]:
        if not np.all(np.isfinite(np.asarray(value, np.float64))):
            return f"{name} is not finite"
    return None


def _models(config: ViTConfig, state: dict | None, seed: int, dtype: str) -> list[tuple[str, Case, GradModel]]:
    out = []
    for case, kind in grad_cases(config, state, seed):
        label = f"{case.name}, {'cross-entropy' if kind == 'cross_entropy' else 'linear loss'}"
        case = Case(label, read_only(case.images), {k: read_only(v) for k, v in case.state.items()})
        loss = draw_loss(config, len(case.images), kind, seed)
        out.append((label, case, GradModel(config, case.state, case.images, loss, dtype=dtype)))
    return out


@lru_cache(maxsize=4)
def _seeded_models(config: ViTConfig, seed: int, dtype: str) -> tuple:
    """The seeded cases' references and spreads, built once per config, seed and dtype (the zoo
    checks seven gradient factories on the same ones); their arrays are read-only."""
    return tuple(_models(config, None, seed, dtype))


class Backward:
    """The backward variant: build the gradient factory on the case's state, take the loss's
    gradients on its images (through its ``PortSide``), compare every tap cotangent, parameter
    and image gradient."""

    def __init__(self, side: PortSide, config: ViTConfig, dtype: str):
        self.side, self.config, self.dtype = side, config, dtype
        self.order: dict[tuple[str, str], int] = {}
        self.diagnoses: dict = {}  # (tensor, case) -> Diagnosis, where a case diverged first

    def run(self, case: Case, model: GradModel, report: GradReport, label: str):
        out, findings = self.side.backward(case, self.config, self.dtype, model.loss)
        for stage, reason in findings:
            finding(report, label, stage, reason)
        if out is None:
            return None
        problem = _structure_problem(out, model.reference)
        if problem:
            finding(report, label, "backward", problem)
            return None
        return out

    def compare(self, out, model: GradModel, report: GradReport, label: str, outcome: Outcome) -> list[GradResult]:
        report.taps = report.taps or bool(out.get("taps"))
        self.order = {
            (kind, name): i
            for i, (kind, name, _) in enumerate(
                backward_order(list(model.reference["taps"]), model.reference["params"])
            )
        }
        results = compare_gradients(out, model)  # taps, parameters, "images" and "loss" never share a name
        failing = [r for r in results if not r.ok]
        first = min(failing, key=self.index) if failing else None
        if first is not None and outcome.earlier(self.index(first)):
            self.diagnoses[(first.name, label)] = guarded(
                first.name, label, lambda: diagnose_gradient(first, out, model, label)
            )
        return results

    def index(self, result: GradResult) -> int:
        return self.order.get((result.kind, result.name), len(self.order))


def verify_grad(
    make_grad: Callable | PortSide,
    config: ViTConfig,
    *,
    port: str = "port",
    state: dict | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> GradReport:
    """``dtype`` (float32 or bfloat16) is passed to the factory as dtype= unless float32."""
    check_grad_dtype(dtype)
    models = _seeded_models(config, seed, dtype) if state is None else _models(config, state, seed, dtype)
    report = GradReport(port, config, cases=[label for label, _, _ in models], dtype=dtype)
    variant = Backward(port_side(make_grad, port), config, dtype)
    outcome = run_cases(report, variant, models)  # the references were built first
    ordered = {
        f"{k}:{n}": i
        for i, (k, n, _) in enumerate(
            backward_order(tap_names(config), [r.name for r in outcome.worst.values() if r.kind == "params"])
        )
    }
    report.results = sorted(outcome.worst.values(), key=lambda r: ordered.get(f"{r.kind}:{r.name}", len(ordered)))
    if outcome.first is not None:
        report.first_divergence, report.first_case = outcome.first_result, outcome.first[2]
        report.diagnosis = variant.diagnoses.get(outcome.first[1:])
    return report


def format_grad_report(report: GradReport, limit: int = 12) -> str:

    lines = [
        f"gradients of {report.port} in {report.dtype}: {report.config.name or 'config'} {report.config.to_dict()}",
        f"cases: {'; '.join(report.cases)}",
        "error = max |port - reference| over the reference's propagated rounding (docs/gradients.md), in "
        "backward order: each tap's cotangent, then the parameters its stage uses",
        "",
    ]
    if not report.taps:
        lines.append("the port returned no tap cotangents: divergences are located at parameters only")
    bad = [r for r in report.results if not r.ok]
    shown = bad[:limit] if bad else []
    rows = [[r.kind[:-1] if r.kind in ("taps", "params") else r.kind, r.name, r.error, r.tol, r.ok] for r in shown]
    summary = {kind: [r for r in report.results if r.kind == kind] for kind in (*KINDS, "loss")}
    for kind, rs in summary.items():
        if rs:
            top = max(rs, key=lambda r: r.error / r.tol if r.tol else np.inf)
            lines.append(
                f"{kind}: {sum(r.ok for r in rs)} of {len(rs)} within tolerance; largest {top.error:.3g} "
                f"({top.name}) against {top.tol:.3g}"
            )
    if rows:
        lines += ["", table(["kind", "name", "error", "tol", "ok"], rows)]
        if len(bad) > limit:
            lines.append(f"... and {len(bad) - limit} more outside tolerance")
    for f in report.failures:
        lines.append(f"FAIL {f['stage']} ({f['case']}): {f['reason']}")
    lines += [f"not judged: {s}" for s in report.skipped]
    if report.conformant:
        lines.append(
            f"CONFORMANT: {len(report.results)} gradients within tolerance on "
            f"{len(report.cases) - len(report.skipped)} cases"
        )
    elif report.first_divergence is not None:
        r = report.first_divergence
        what = "the cotangent of tap" if r.kind == "taps" else ("the gradient of" if r.kind == "params" else "")
        lines.append(
            f"NOT CONFORMANT: first divergence in backward order: {what} {r.name} (stage {r.stage}), "
            f"{r.error:.3g} against a tolerance of {r.tol:.3g} ({report.first_case})"
        )
        if report.diagnosis is not None:
            lines.append(f"  {report.diagnosis.line()}")
    else:
        lines.append(f"NOT CONFORMANT: {report.failures[0]['reason'] if report.failures else 'nothing was checked'}")
    return "\n".join(lines)
