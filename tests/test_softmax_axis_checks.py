"""The companions of conformance/tests/test_softmax_axis.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import numpy as np
from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import expect_failure, mutant


def _cross_case(seed=0):
    from weights import mha_shapes

    options = dict(dim=8, context_dim=6, num_heads=2, head_dim=4, qkv_bias=True)
    rng = np.random.default_rng(seed)
    state = S.WeightCase(seed, 16.0).make_params(mha_shapes(**options))
    return P.AttentionCase(
        options, state, rng.normal(size=(2, 3, 8)).astype(np.float32), rng.normal(size=(2, 5, 6)).astype(np.float32)
    )


def test_sum_over_keys_check_fails_on_softmax_over_queries():
    expect_failure(
        P.check_cross_attention_weights_sum_to_one_over_keys,
        "mutant",
        mutant("mlx_mha_softmax_over_queries"),
        _cross_case(),
        match="sum to 1 over keys",
    )


def test_query_constant_check_fails_on_softmax_over_queries():
    case = _cross_case()
    expect_failure(
        P.check_query_constant_changes_nothing,
        "mutant",
        mutant("mlx_mha_softmax_over_queries"),
        case,
        np.array([5.0, -3.0, 0.0]),
    )


def test_permutation_checks_fail_on_a_causal_mask():
    case = _cross_case()
    expect_failure(
        P.check_key_value_permutation_invariant, "mutant", mutant("torch_mha_causal_mask"), case, [4, 3, 2, 1, 0]
    )
    expect_failure(P.check_query_permutation_equivariant, "mutant", mutant("torch_mha_causal_mask"), case, [2, 1, 0])


def test_large_logit_check_fails_on_a_softmax_without_the_max_subtracted():
    expect_failure(
        P.check_large_logits_finite_and_match_oracle,
        "mutant",
        mutant("torch_mha_naive_softmax"),
        _cross_case(),
        match="non-finite",
    )


def test_model_softmax_check_fails_on_query_axis_scale_after_softmax_and_wrong_scale():
    from impls import get_config

    config = get_config("vit_test_token")
    case = P.ModelCase(config, S.WeightCase(2, 4.0).make(config), S.make_images(config, 2, "ordinary", 0))
    for name in (
        "mlx_softmax_over_queries",
        "torch_scale_after_softmax",
        "torch_scale_by_embed_dim",
        "mlx_attention_scale_missing",
    ):
        expect_failure(P.check_attention_weights_are_softmax_over_keys, name, mutant(name), case)
