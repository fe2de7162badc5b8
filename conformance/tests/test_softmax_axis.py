"""Softmax axis: weights sum to 1 over keys (cross-attention, Nq != Nk), a per-query constant
changes nothing, keys and values permute together freely, queries permute the output, large
logits stay finite; and in the whole model the weights are softmax(q k^T / sqrt(hd)) over keys."""

import numpy as np
from hypothesis import strategies as st

from conformance import properties as P
from conformance import strategies as S
from conformance.tests.helpers import attention_factory, budget, check_property, drawn, factory

CROSS = S.attention_property_cases(cross=True, min_len=2)


@drawn(None, case=CROSS)
def test_weights_sum_to_one_over_keys_not_queries_in_cross_attention(attention_port, case):
    P.check_cross_attention_weights_sum_to_one_over_keys(attention_port, attention_factory(attention_port), case)


@drawn(None, case=S.attention_property_cases(min_len=2), data=st.data())
def test_adding_a_constant_to_a_querys_logits_changes_nothing(attention_port, case, data):
    n = case.x.shape[1]  # distinct constants per query: equal ones would pass a softmax over queries too
    shift = np.asarray(data.draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n, unique=True)), np.float64)
    P.check_query_constant_changes_nothing(attention_port, attention_factory(attention_port), case, shift)


@drawn(None, case=CROSS, data=st.data())
def test_permuting_keys_and_values_together_leaves_the_output_unchanged(attention_port, case, data):
    perm = data.draw(st.permutations(range(case.context.shape[1])))
    P.check_key_value_permutation_invariant(attention_port, attention_factory(attention_port), case, list(perm))


@drawn(None, case=CROSS, data=st.data())
def test_permuting_queries_permutes_the_output(attention_port, case, data):
    perm = data.draw(st.permutations(range(case.x.shape[1])))
    P.check_query_permutation_equivariant(attention_port, attention_factory(attention_port), case, list(perm))


@drawn(None, case=S.attention_property_cases())
def test_large_logits_stay_finite_and_match_the_oracle(attention_port, case):
    P.check_large_logits_finite_and_match_oracle(attention_port, attention_factory(attention_port), case)


@drawn(budget(2), case=S.model_cases(S.configs(max_depth=2)))
def test_model_attention_weights_are_softmax_of_scaled_qk_over_keys(port, case):
    check_property(P.check_attention_weights_are_softmax_over_keys, port, factory(port), case)


# ----------------------------------------------------------------------------- companions
