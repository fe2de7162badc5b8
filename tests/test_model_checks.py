"""The companions of conformance/tests/test_model.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import dataclasses
import numpy as np
from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import expect_failure, mutant
from impls import get_config
from conformance.tests.test_model import HARD  # noqa: F401


def _case(kind="ordinary", seed=0, scale=4.0):
    config = get_config("vit_test_token")
    return P.ModelCase(config, S.WeightCase(seed, scale).make(config), S.make_images(config, 3, kind, seed))


def test_oracle_check_fails_on_a_shared_layernorm_and_names_the_stage():
    failure = expect_failure(
        P.check_matches_oracle,
        "mlx_shared_layernorm",
        mutant("mlx_shared_layernorm"),
        _case(),
        match="first divergent stage: blocks.0.norm2",
    )
    assert "config: ViTConfig(" in str(failure) and "rel_err" in str(failure) and "tol" in str(failure)


def test_oracle_check_fails_on_softmax_without_max_in_float32_and_float16():
    """Trained-like weights put logits in the hundreds: exp overflows past 88 (float32), 11 (float16)."""
    case = HARD[3]
    for dtype in ("float32", "float16"):
        expect_failure(
            P.check_matches_oracle,
            "torch_naive_softmax",
            mutant("torch_naive_softmax"),
            dataclasses.replace(case, dtype=dtype),
            match="first divergent stage: blocks.0.attn.weights",
        )


def test_low_precision_check_fails_on_layernorm_statistics_in_float16():
    expect_failure(
        P.check_matches_oracle,
        "torch_layernorm_stats_fp16",
        mutant("torch_layernorm_stats_fp16"),
        dataclasses.replace(HARD[3], dtype="float16"),
        match="first divergent stage: blocks.0.norm1",
    )


def test_shared_layernorm_hides_behind_default_norm_weights():
    """Why the initialiser draws distinct norms: with timm's ones/zeros the bug is invisible."""
    case = _case()
    for k in case.state:
        if "norm" in k:
            case.state[k] = (np.ones_like if k.endswith("weight") else np.zeros_like)(case.state[k])
    P.check_matches_oracle("mlx_shared_layernorm", mutant("mlx_shared_layernorm"), case)


def test_batch_checks_fail_on_a_softmax_across_the_batch():
    expect_failure(
        P.check_batch_elements_independent,
        "mutant",
        mutant("torch_softmax_over_batch"),
        _case(),
        S.make_images(get_config("vit_test_token"), 3, "ordinary", 9),
    )
    expect_failure(P.check_batch_size_invariant, "mutant", mutant("torch_softmax_over_batch"), _case())


def test_determinism_check_fails_on_dropout_left_active():
    expect_failure(
        P.check_deterministic,
        "mutant",
        mutant("mlx_dropout_left_active"),
        _case(),
        match="two calls on the same input differ",
    )


def test_layernorm_check_fails_on_a_shared_norm_and_on_the_wrong_epsilon():
    expect_failure(P.check_layernorms_in_place, "mutant", mutant("mlx_shared_layernorm"), _case(), match="norm2")
    expect_failure(
        P.check_layernorms_in_place,
        "mutant",
        mutant("torch_layernorm_eps_1e5"),
        _case("near_constant", scale=1.0),
        match="norm1",
    )


def test_a_crashing_port_is_a_finding_not_a_crash():
    def make(config, state):
        def forward(images):
            raise RuntimeError("out of memory")

        return forward

    expect_failure(P.check_matches_oracle, "crashy", make, _case(), match="raised RuntimeError: out of memory")
