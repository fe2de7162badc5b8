"""Patch embedding: equals the oracle, the conv equals rearrange + linear, a one-patch shift
shifts the token grid, tokens are row-major; on non-square images and patches, 1 to 4 channels."""

from hypothesis import strategies as st

from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import budget, check_property, drawn, factory
from impls import ViTConfig


def _fixed_case(in_chans=3, patch=(2, 3), grid=(2, 3), kind="ordinary"):
    config = ViTConfig(
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        patch_size=patch,
        in_chans=in_chans,
        num_classes=3,
        embed_dim=8,
        depth=1,
        num_heads=2,
    )
    return P.ModelCase(config, S.WeightCase(1, 1.0).make(config), S.make_images(config, 2, kind, 0))


# Depth 1 and the original ViT suffice: these properties read the patch_embed tap, which the
# family's options do not change (pre_norm's missing bias aside: conformance.properties handles it).
PATCH_CASES = S.model_cases(S.configs(max_depth=1, family=False), weights=S.weight_cases(S.SCALES[:4], offsets=False))


def _check_patch_embed_equals_oracle(port, make, case):
    P.check_stages_match_oracle(port, make, case, ("patch_embed",))


@drawn(budget(2), case=PATCH_CASES)
def test_patch_embed_equals_the_oracle(port, case):
    check_property(_check_patch_embed_equals_oracle, port, factory(port), case)


@drawn(budget(2), data=st.data(), in_chans=st.sampled_from([1, 3, 4]))
def test_patch_embed_holds_for_1_3_and_4_channels_on_non_square_images(port, data, in_chans):
    config = data.draw(
        S.configs(max_depth=1, family=False)
        .filter(lambda c: c.grid_size[0] != c.grid_size[1])
        .map(lambda c: c.replace(in_chans=in_chans))
    )
    case = data.draw(S.model_cases(st.just(config), weights=S.weight_cases(S.SCALES[:4], offsets=False)))
    check_property(_check_patch_embed_equals_oracle, port, factory(port), case)
    check_property(P.check_patch_embed_is_rearrange_then_linear, port, factory(port), case)


@drawn(budget(2), examples=[dict(case=_fixed_case(patch=(3, 3)))], case=PATCH_CASES)
def test_conv_patch_embed_equals_rearrange_then_linear(port, case):
    check_property(P.check_patch_embed_is_rearrange_then_linear, port, factory(port), case)


@drawn(
    budget(2),
    case=S.model_cases(
        S.configs(max_depth=1, max_grid=4, family=False).filter(lambda c: min(c.grid_size) >= 2),
        weights=S.weight_cases(S.SCALES[:4], offsets=False),
    ),
)
def test_shifting_the_image_by_one_patch_shifts_the_token_grid(port, case):
    check_property(P.check_patch_shift_shifts_tokens, port, factory(port), case)


@drawn(
    budget(2),
    case=S.model_cases(
        S.configs(max_depth=1, family=False).filter(lambda c: min(c.grid_size) >= 2),
        weights=S.weight_cases(S.SCALES[:4], offsets=False),
    ),
    patch=st.tuples(st.integers(0, 3), st.integers(0, 3)),
)
def test_tokens_come_out_row_major(port, case, patch):
    check_property(P.check_tokens_row_major, port, factory(port), case, patch)


# ----------------------------------------------------------------------------- companions
