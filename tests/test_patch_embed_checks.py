"""The companions of conformance/tests/test_patch_embed.py: each of its properties fails on a deliberately
broken port (and the project's checks that take no port). Not shipped."""

from conformance import properties as P
from conformance.tests.helpers import expect_failure, factory, mutant
from conformance.tests.test_patch_embed import _check_patch_embed_equals_oracle, _fixed_case  # noqa: F401


def test_oracle_conv_equals_rearrange_then_linear():
    case = _fixed_case(in_chans=3, patch=(2, 3), grid=(2, 3))
    P.check_patch_embed_is_rearrange_then_linear("numpy", factory("numpy"), case)


def test_patch_embed_check_fails_on_a_kernel_with_h_and_w_swapped():
    case = _fixed_case(patch=(3, 3))  # square patches load; the kernel is transposed spatially
    expect_failure(_check_patch_embed_equals_oracle, "mutant", mutant("mlx_conv_kernel_hw_swapped"), case)
    expect_failure(P.check_patch_embed_is_rearrange_then_linear, "mutant", mutant("mlx_conv_kernel_hw_swapped"), case)


def test_patch_embed_check_reports_a_kernel_that_does_not_load_on_non_square_patches():
    case = _fixed_case(patch=(2, 3))
    expect_failure(
        _check_patch_embed_equals_oracle,
        "mutant",
        mutant("mlx_conv_kernel_hw_swapped"),
        case,
        match="raised WeightError",
    )


def test_rearrange_check_fails_on_the_seed_posts_s1_s2_c_linear_embedding():
    expect_failure(
        P.check_patch_embed_is_rearrange_then_linear,
        "mutant",
        mutant("torch_patch_linear_s1s2c"),
        _fixed_case(in_chans=3),
    )


def test_shift_and_row_major_checks_fail_on_column_major_tokens():
    case = _fixed_case(grid=(2, 3))
    expect_failure(P.check_patch_shift_shifts_tokens, "mutant", mutant("torch_tokens_column_major"), case)
    expect_failure(
        P.check_tokens_row_major,
        "mutant",
        mutant("torch_tokens_column_major"),
        case,
        (0, 1),
        match="should light token 1 only",
    )
