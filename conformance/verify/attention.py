"""An attention port against the oracle's MultiHeadAttention, with masks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.numerics.compare import StageResult
from conformance.report import describe_exception
from conformance.verify.cases import read_only
from conformance.verify.report import Report, finding


ATTENTION_STAGES = ("attn.weights", "attn")


def attention_cases(seed: int = 0):
    """Cross-attention (Nq=5, Nk=7, context width 6) with no mask, a boolean keep-mask, an
    additive mask, a mask with a fully masked query row, and inputs large enough that the
    logits reach the hundreds."""
    from conformance.properties import AttentionCase
    from weights import init_params, mha_shapes

    options = dict(dim=8, context_dim=6, num_heads=2, head_dim=4, qkv_bias=True)
    state = init_params(mha_shapes(**options), seed=seed, scale=16.0)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    ctx = rng.normal(size=(2, 7, 6)).astype(np.float32)
    keep = rng.random((2, 1, 5, 7)) < 0.6
    keep[..., 0] = True
    dead = keep.copy()
    dead[:, :, 2] = False
    masks = {"no mask": None, "boolean mask": keep, "additive mask": np.where(keep, rng.normal(0, 2, keep.shape),
                                                                              -np.inf).astype(np.float32),
             "fully masked row": dead}
    cases = [(name, AttentionCase(options, state, x, ctx), mask) for name, mask in masks.items()]
    # Logits in the hundreds: where a softmax that does not subtract the row maximum overflows.
    cases.append(("large logits", AttentionCase(options, state, x * 30, ctx * 30), None))
    return cases


def verify_attention(make_attention: Callable, *, port: str = "attention port", seed: int = 0) -> Report:
    """An attention factory against the oracle's MultiHeadAttention, per mask case, end to end
    (the port emits no q, k, v), on read-only inputs."""
    from conformance.numerics.compare import compare_stage
    from impls.protocol import get_config

    cases = attention_cases(seed)
    report = Report(port, get_config("vit_test_token"), cases=[c[0] for c in cases], attention=dict(cases[0][1].options))
    worst: dict[str, StageResult] = {}
    first = len(ATTENTION_STAGES)
    for name, case, mask in cases:
        model = case.error_model(mask=mask)  # the oracle runs first
        x, ctx = read_only(case.x), read_only(case.context)
        try:
            out, weights = make_attention({k: read_only(v) for k, v in case.state.items()}, **case.options)(x, ctx,
                                                                                                            mask)
        except Exception as e:  # noqa: BLE001
            finding(report, name, "forward", f"the port raised {describe_exception(e)}")
            continue
        if not (np.array_equal(x, case.x) and np.array_equal(ctx, case.context)):
            finding(report, name, "forward", "the port wrote to its inputs")
            continue
        results = [compare_stage("attn", out, model, {})]
        if weights is not None:
            results.insert(0, compare_stage("attn.weights", weights, model, {}))
        for r in results:
            if not r.ok:
                first = min(first, ATTENTION_STAGES.index(r.name))
            if r.name not in worst or r.separation > worst[r.name].separation:
                worst[r.name] = r
                report.worst_case[r.name] = name
    report.stages = [worst[n] for n in ATTENTION_STAGES if n in worst]
    report.first_divergence = ATTENTION_STAGES[first] if first < len(ATTENTION_STAGES) else None
    return report
