"""The forward check: a port against the float64 oracle on verify's cases, stage by stage."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conformance.numerics.compare import StageResult, compare_outputs
from conformance.numerics.error_model import CaseModel
from conformance.verify.cases import Case, Handed, default_cases, seeded_cases
from conformance.verify.report import Report, finding
from impls import tap_names
from impls.protocol import ViTConfig


def verify(make: Callable, config: ViTConfig, *, port: str = "port", state: dict | None = None,
           cases: list[Case] | None = None, seed: int = 0, dtype: str = "float32", policy: str = "mixed") -> Report:
    from conformance.properties import ModelCase, PropertyFailure, build, check_deterministic

    from conformance.support import check_supported, supports_of

    check_supported(supports_of(make), config)  # Unsupported names the option
    if cases is None and state is None:
        pairs = list(seeded_cases(config, seed, dtype))
    else:
        cases = default_cases(config, state, seed) if cases is None else cases
        pairs = [(case, None) for case in cases]
    cases = [case for case, _ in pairs]
    report = Report(port, config, cases=[c.name for c in cases], dtype=dtype)
    names = tap_names(config)
    worst: dict[str, StageResult] = {}
    first_index = len(names)
    judged: list[Case] = []
    for case, model in pairs:
        model = model or CaseModel(config, case.state, case.images, dtype)  # the oracle runs first
        beyond = model.beyond_range()
        if beyond:  # no port can represent this case in the dtype: judging it would be a false alarm
            report.skipped.append(f"{case.name}: {beyond}")
            continue
        judged.append(case)
        handed = Handed(case)
        built, forward = handed.call(report, "load", build, make, config, handed.state, dtype)
        if not built:
            continue
        changed = handed.changed_state()
        if changed:
            finding(report, case.name, "load", f"the port changed the state it was handed: {', '.join(changed[:4])}")
            continue
        ran, out = handed.call(report, "forward", forward, handed.images)
        if not ran:
            continue
        if handed.wrote_images() or handed.changed_state():
            finding(report, case.name, "forward", "the port wrote to its inputs (images or state) during forward")
            continue
        if isinstance(out, Mapping):
            unknown = sorted(set(out) - set(names))
            if unknown:
                finding(report, case.name, unknown[0], f"unknown tap names {unknown}; known: see impls.tap_names")
        report.unseen.update(getattr(out, "unseen", {}))
        report.sources.update(getattr(out, "sources", {}))
        for stage, reason in getattr(out, "findings", ()):
            if not any(f["stage"] == stage and f["reason"] == reason for f in report.failures):
                finding(report, case.name, stage, reason)
            if stage in names:
                first_index = min(first_index, names.index(stage))
        second = getattr(out, "second", None)  # a second pass off the model's own path: judged too
        results = compare_outputs(out.own_pass() if second is not None else out, model, dtype=dtype, policy=policy)
        if second is not None:
            results += [r for r in compare_outputs(second, model, dtype=dtype, policy=policy)
                        if r.name != "logits" or "logits" in second]
        for r in results:
            if not r.ok:
                first_index = min(first_index, names.index(r.name))
                if r.ratio is None or not np.isfinite(r.ratio):
                    finding(report, case.name, r.name, r.reason)
            prev = worst.get(r.name)
            if prev is None or r.separation > prev.separation:
                worst[r.name] = r
                report.worst_case[r.name] = case.name
    report.stages = [worst[n] for n in names if n in worst]
    for n in report.unseen:
        report.sources.pop(n, None)
    if first_index < len(names):
        report.first_divergence = names[first_index]
    elif report.failures:
        report.first_divergence = report.failures[0]["stage"]  # load or forward: before any stage
    if judged and not report.failures:
        try:
            check_deterministic(port, make, ModelCase(config, judged[0].state, judged[0].images, dtype=dtype))
        except PropertyFailure as e:
            finding(report, judged[0].name, e.stage or "logits", "two calls on the same input differ (randomness at "
                                                                 "inference)")
    return report
