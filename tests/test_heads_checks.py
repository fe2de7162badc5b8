"""The companions of conformance/tests/test_heads.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

import numpy as np
from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import expect_failure, mutant


def _model_case():
    from impls import get_config

    config = get_config("vit_test_token")
    return P.ModelCase(config, S.WeightCase(3, 4.0).make(config), S.make_images(config, 2, "ordinary", 1))


def test_head_slice_check_fails_on_heads_merged_head_dim_first():
    expect_failure(
        P.check_heads_merge_head_major,
        "mutant",
        mutant("jax_heads_merged_head_dim_first"),
        _model_case(),
        1,
        match="other heads' slices",
    )


def test_single_heads_check_fails_on_a_scale_by_the_model_width():
    from weights import mha_shapes

    options = dict(dim=8, context_dim=8, num_heads=2, head_dim=4, qkv_bias=True)
    rng = np.random.default_rng(0)
    case = P.AttentionCase(
        options,
        S.WeightCase(0, 16.0).make_params(mha_shapes(**options)),
        rng.normal(size=(1, 4, 8)).astype(np.float32),
        None,
    )
    expect_failure(P.check_multihead_is_single_heads_concatenated, "mutant", mutant("torch_mha_scale_by_dim"), case)
