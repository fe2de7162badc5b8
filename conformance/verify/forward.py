"""The forward check: a port against the float64 oracle on verify's cases, stage by stage."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.numerics.compare import StageResult, compare_outputs
from conformance.numerics.error_model import CaseModel
from conformance.verify.cases import Case, Handed, default_cases, seeded_cases
from conformance.verify.loop import Outcome, run_cases
from conformance.verify.report import Report, finding
from impls import tap_names
from impls.protocol import ViTConfig


class Forward:
    """The forward variant: build the port on the case's state, run it on its images, compare
    every tap it emitted (and both passes of a captured model) with the oracle's."""

    def __init__(self, make: Callable, config: ViTConfig, dtype: str, policy: str):
        self.make, self.config, self.dtype, self.policy = make, config, dtype, policy
        self.names = tap_names(config)

    def run(self, handed: Handed, model, report: Report, label: str):
        from conformance.properties import build

        built, forward = handed.call(report, "load", build, self.make, self.config, handed.state, self.dtype)
        if not built:
            return None
        changed = handed.changed_state()
        if changed:
            finding(report, label, "load", f"the port changed the state it was handed: {', '.join(changed[:4])}")
            return None
        ran, out = handed.call(report, "forward", forward, handed.images)
        if not ran:
            return None
        if handed.wrote_images() or handed.changed_state():
            finding(report, label, "forward", "the port wrote to its inputs (images or state) during forward")
            return None
        return out

    def compare(self, out, model, report: Report, label: str, outcome: Outcome) -> list[StageResult]:
        names = self.names
        if isinstance(out, Mapping):
            unknown = sorted(set(out) - set(names))
            if unknown:
                finding(report, label, unknown[0], f"unknown tap names {unknown}; known: see impls.tap_names")
        report.unseen.update(getattr(out, "unseen", {}))
        report.sources.update(getattr(out, "sources", {}))
        for stage, reason in getattr(out, "findings", ()):  # what capture found about the model
            if not any(f["stage"] == stage and f["reason"] == reason for f in report.failures):
                finding(report, label, stage, reason)
            if stage in names:
                outcome.diverged(names.index(stage), stage, label)
        second = getattr(out, "second", None)  # a second pass off the model's own path: judged too
        results = compare_outputs(
            out.own_pass() if second is not None else out, model, dtype=self.dtype, policy=self.policy
        )
        if second is not None:
            results += [
                r
                for r in compare_outputs(second, model, dtype=self.dtype, policy=self.policy)
                if r.name != "logits" or "logits" in second
            ]
        for r in results:
            if not r.ok and (r.ratio is None or not np.isfinite(r.ratio)):
                finding(report, label, r.name, r.reason)
        return results

    def index(self, result: StageResult) -> int:
        return self.names.index(result.name)


def verify(
    make: Callable,
    config: ViTConfig,
    *,
    port: str = "port",
    state: dict | None = None,
    cases: list[Case] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    policy: str = "mixed",
) -> Report:
    from conformance.properties import ModelCase, PropertyFailure, check_deterministic

    from conformance.support import check_supported, supports_of

    check_supported(supports_of(make), config)  # Unsupported names the option
    if cases is None and state is None:
        pairs = list(seeded_cases(config, seed, dtype))
    else:
        cases = default_cases(config, state, seed) if cases is None else cases
        pairs = [(case, None) for case in cases]
    report = Report(port, config, cases=[c.name for c, _ in pairs], dtype=dtype)
    variant = Forward(make, config, dtype, policy)
    # the oracle runs first, case by case
    outcome = run_cases(
        report,
        variant,
        ((case.name, case, model or CaseModel(config, case.state, case.images, dtype)) for case, model in pairs),
    )
    names = variant.names
    report.stages = [outcome.worst[n] for n in names if n in outcome.worst]
    for n in report.unseen:
        report.sources.pop(n, None)
    if outcome.first is not None:
        report.first_divergence = outcome.first[1]
    elif report.failures:
        report.first_divergence = report.failures[0]["stage"]  # load or forward: before any stage
    if outcome.judged and not report.failures:
        case = outcome.judged[0]
        try:
            check_deterministic(port, make, ModelCase(config, case.state, case.images, dtype=dtype))
        except PropertyFailure as e:
            finding(
                report, case.name, e.stage or "logits", "two calls on the same input differ (randomness at inference)"
            )
    return report
