"""Head split and merge: split then merge is the identity bitwise, merges are head-major (one
head's weights move only its slice of the merged output, as timm's proj expects), and
multi-head attention is single-head attentions side by side."""

import numpy as np
from einops import rearrange
from hypothesis import strategies as st

from conformance import properties as P
from conformance import strategies as S
from conformance.builtin import framework
from conformance.tests.helpers import attention_factory, budget, check_property, drawn, factory


# batch, tokens, heads and head width of a split or merged activation
HEAD_SHAPES = dict(
    b=st.integers(1, 3),
    n=st.integers(1, 9),
    h=st.integers(1, 4),
    hd=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 2**31 - 1),
)


@drawn(None, **HEAD_SHAPES)
def test_split_then_merge_is_the_identity_bitwise(framework_port, b, n, h, hd, seed):
    module, to_fw, to_np = framework(framework_port)
    x = np.random.default_rng(seed).normal(size=(b, n, h * hd)).astype(np.float32)
    split = module.split_heads(to_fw(x), h)
    assert to_np(split).tobytes() == rearrange(x, "b n (h d) -> b h n d", h=h).tobytes()
    assert to_np(module.merge_heads(split)).tobytes() == x.tobytes()


@drawn(None, **HEAD_SHAPES)
def test_merged_layout_is_head_major(framework_port, b, n, h, hd, seed):
    module, to_fw, to_np = framework(framework_port)
    x = np.random.default_rng(seed).normal(size=(b, h, n, hd)).astype(np.float32)
    assert to_np(module.merge_heads(to_fw(x))).tobytes() == rearrange(x, "b h n d -> b n (h d)").tobytes()


@drawn(
    budget(2),
    case=S.model_cases(
        S.configs(max_depth=1).filter(lambda c: c.num_heads > 1), weights=S.weight_cases(S.SCALES[:4], offsets=False)
    ),
    head=st.integers(0, 3),
)
def test_perturbing_one_heads_weights_changes_only_its_slice(port, case, head):
    check_property(P.check_heads_merge_head_major, port, factory(port), case, head)


@drawn(None, case=S.attention_property_cases(square_heads=True))
def test_multihead_attention_is_single_heads_side_by_side(attention_port, case):
    P.check_multihead_is_single_heads_concatenated(attention_port, attention_factory(attention_port), case)


# ----------------------------------------------------------------------------- companions
