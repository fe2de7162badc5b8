"""An attention port against the oracle's MultiHeadAttention, with masks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.diagnosis import guarded
from conformance.diagnosis.fit import diagnose_attention
from conformance.numerics.compare import StageResult, compare_stage
from conformance.sandbox.portside import PortSide, port_side
from conformance.verify.cases import Case
from conformance.verify.loop import Outcome, run_cases
from conformance.verify.report import Report, finding
from impls.protocol import get_config
from weights import init_params, mha_shapes

ATTENTION_STAGES = ("attn.weights", "attn")


def attention_cases(seed: int = 0):
    """Cross-attention (Nq=5, Nk=7, context width 6) with no mask, a boolean keep-mask, an
    additive mask, a mask with a fully masked query row, and inputs large enough that the
    logits reach the hundreds."""
    from conformance.properties import AttentionCase

    options = dict(dim=8, context_dim=6, num_heads=2, head_dim=4, qkv_bias=True)
    state = init_params(mha_shapes(**options), seed=seed, scale=16.0)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    ctx = rng.normal(size=(2, 7, 6)).astype(np.float32)
    keep = rng.random((2, 1, 5, 7)) < 0.6
    keep[..., 0] = True
    dead = keep.copy()
    dead[:, :, 2] = False
    masks = {
        "no mask": None,
        "boolean mask": keep,
        "additive mask": np.where(keep, rng.normal(0, 2, keep.shape), -np.inf).astype(np.float32),
        "fully masked row": dead,
    }
    cases = [(name, AttentionCase(options, state, x, ctx), mask) for name, mask in masks.items()]
    # Logits in the hundreds: where a softmax that does not subtract the row maximum overflows.
    cases.append(("large logits", AttentionCase(options, state, x * 30, ctx * 30), None))
    return cases


class AttentionCall:
    """The attention variant: build the attention port on the case's state and options, call it
    on (x, context, mask) through its ``PortSide``, compare its output and weights (when it
    returns them)."""

    def __init__(self, side: PortSide, options: dict):
        self.side, self.options = side, options
        self.diagnoses: dict = {}  # (stage, case) -> Diagnosis, where a case diverged first

    def run(self, case: Case, model, report: Report, label: str):
        out, findings = self.side.attention(case, self.options)
        for stage, reason in findings:
            finding(report, label, stage, reason)
        return out

    def compare(self, out, model, report: Report, label: str, outcome: Outcome) -> list[StageResult]:
        try:
            out, weights = out
        except (TypeError, ValueError):
            finding(
                report, label, "forward", f"the port must return (output, weights or None), got {type(out).__name__}"
            )
            return []
        results = [compare_stage("attn", out, model, {})]
        if weights is not None:
            results.insert(0, compare_stage("attn.weights", weights, model, {}))
        first = next((r for r in results if not r.ok), None)
        if first is not None and outcome.earlier(self.index(first)):
            emitted = weights if first.name == "attn.weights" else out
            self.diagnoses[(first.name, label)] = guarded(
                first.name, label, lambda: diagnose_attention(first.name, emitted, model, label)
            )
        return results

    def index(self, result: StageResult) -> int:
        return ATTENTION_STAGES.index(result.name)


def verify_attention(make_attention: Callable | PortSide, *, port: str = "attention port", seed: int = 0) -> Report:
    """An attention factory against the oracle's MultiHeadAttention, per mask case, end to end
    (the port emits no q, k, v), on read-only inputs."""

    cases = attention_cases(seed)
    options = dict(cases[0][1].options)
    report = Report(port, get_config("vit_test_token"), cases=[c[0] for c in cases], attention=options)
    variant = AttentionCall(port_side(make_attention, port), options)
    outcome = run_cases(
        report,
        variant,
        (
            (name, Case(name, case.x, case.state, case.context, mask), case.error_model(mask=mask))
            for name, case, mask in cases
        ),
    )  # the oracle runs first
    report.stages = [outcome.worst[n] for n in ATTENTION_STAGES if n in outcome.worst]
    report.first_divergence = outcome.first[1] if outcome.first is not None else None
    if outcome.first is not None:
        report.diagnosis = variant.diagnoses.get(outcome.first[1:])
    return report
